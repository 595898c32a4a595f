"""The ``kvwatch`` command: a thin dispatcher to one module per subcommand.

Each subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``. Only the chosen
command's module is imported, so ``kvwatch plan`` never pays for the HTTP stack and one command's
import error cannot break another. Exit codes: 0 ok, 2 bad usage or config, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvwatch import __version__
from kvwatch.settings import SettingsError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("kvwatch.app", "run the sidecar: poll vLLM, forecast, serve kvwatch_* metrics"),
    "check": ("kvwatch.check", "one poll of a vLLM endpoint (or a saved payload), then a diagnosis"),
    "plan": ("kvwatch.plan", "KV capacity sums and what-if scenarios for a model on a GPU"),
    "simulate": ("kvwatch.sim.cli", "the built-in vLLM simulator serving /metrics"),
    "demo": ("kvwatch.demo", "simulator + sidecar together, filling the KV cache in minutes"),
    "backtest": ("kvwatch.backtest.cli", "score the exhaustion forecast against baselines on traces"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvwatch",
        description="KV-cache watchdog for vLLM: exporter, exhaustion forecaster and alerting sidecar.",
    )
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS:
        command = None
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except SettingsError as exc:
        print(f"kvwatch {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
