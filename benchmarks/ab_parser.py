"""A/B of the filtered parse: ``kvwatch/exposition.py`` at a git revision against the working tree's, in one process.

Both parse the three payloads of bench_parser.py with a typical poll's filter (``wanted_for(latency=False)``),
interleaved (old, new, old, ...), 15 rounds of 40 parses; the minimum of each side is reported. The two results
are asserted equal first, so a speed-up never hides a change of behaviour.

    .venv/bin/python benchmarks/ab_parser.py HEAD~3
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_parser import PAYLOADS

import kvwatch.exposition as current
from kvwatch.engines.detect import wanted_for

ROOT = Path(__file__).resolve().parent.parent


def module_at(revision: str) -> types.ModuleType:
    """``kvwatch.exposition`` as it was at ``revision`` (a module of its own beside the current one)."""
    source = subprocess.run(["git", "show", f"{revision}:src/kvwatch/exposition.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("exposition_at_" + revision.replace("~", "_").replace("^", "_"))
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{revision}:src/kvwatch/exposition.py", "exec"), module.__dict__)
    return module


def flat(exposition: Any) -> tuple[dict[str, Any], frozenset[str]]:
    return {f.name: (f.type, [(s.name, s.labels, s.value) for s in f.samples]) for f in exposition}, exposition.names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="the git revision to compare with (e.g. HEAD~1, main)")
    args = parser.parse_args(argv)
    old, wanted = module_at(args.revision), wanted_for(None, latency=False)
    for name, make in PAYLOADS.items():
        text = make()
        assert flat(old.parse(text, wanted)) == flat(current.parse(text, wanted)), f"{name}: results differ"
        best = {"old": float("inf"), "new": float("inf")}
        for _ in range(15):
            for side, module in (("old", old), ("new", current)):
                started = time.perf_counter()
                for _ in range(40):
                    module.parse(text, wanted)
                best[side] = min(best[side], (time.perf_counter() - started) / 40)
        print(f"{name:8} {args.revision}: {best['old'] * 1e3:.3f} ms   working tree: {best['new'] * 1e3:.3f} ms   "
              f"({best['old'] / best['new']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
