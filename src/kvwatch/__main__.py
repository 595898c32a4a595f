"""`python -m kvwatch`: the same command line as the `kvwatch` entry point (kvwatch.cli)."""

from kvwatch.cli import main

raise SystemExit(main())
