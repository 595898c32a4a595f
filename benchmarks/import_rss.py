"""What each import of ``kvwatch serve`` adds to the process's RSS, in the order serve loads them.

A fresh interpreter imports one module at a time and reads VmRSS (``/proc/self/status``) after each: the
figures docs/performance.md ("Sidecar memory") quotes. Run it a few times; single figures move by ~0.2 MB.
kvwatch's bytecode is compiled first (soak_rss.compile_kvwatch), as in the image, so that the figures are
imports, not the compiler's peak.

    .venv/bin/python benchmarks/import_rss.py
"""

from __future__ import annotations

import importlib
import sys

# In the order `kvwatch serve` loads them: the CLI, then the serve command's own imports, then the analyzers.
STEPS = ("ssl", "kvwatch.settings", "httpx", "prometheus_client",
         "kvwatch.serve.app", "kvwatch.serve.capacity", "kvwatch.serve.forecast", "kvwatch.serve.latency")


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> int:
    if sys.argv[1:] != ["--measure"]:  # compile, then measure in a fresh interpreter that imported nothing else
        import subprocess

        from soak_rss import compile_kvwatch

        compile_kvwatch()
        return subprocess.run([sys.executable, __file__, "--measure"]).returncode
    importlib.import_module("kvwatch.cli")
    base = previous = rss_mb()
    print(f"{'python + kvwatch.cli':40s} {base:6.1f} MB")
    for name in STEPS:
        before = set(sys.modules)
        importlib.import_module(name)
        now = rss_mb()
        print(f"{name:40s} {now - previous:+6.1f} MB  ({len(set(sys.modules) - before):3d} modules)")
        previous = now
    print(f"{'total':40s} {previous:6.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
