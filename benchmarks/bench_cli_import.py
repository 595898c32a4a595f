"""CLI start-up: wall time of ``kvwatch --help`` and ``import kvwatch.cli`` in fresh interpreters, and the
slowest imports by ``python -X importtime`` (cumulative microseconds).

    .venv/bin/python benchmarks/bench_cli_import.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def wall(argv: list[str], runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return min(times), statistics.median(times)


def slowest_imports(module: str, top: int = 8) -> list[tuple[int, str]]:
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], check=True,
                         capture_output=True, text=True).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
        rows.append((int(cumulative), name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    for label, argv in (("python -c pass", [sys.executable, "-c", "pass"]),
                        ("import kvwatch.cli", [sys.executable, "-c", "import kvwatch.cli"]),
                        ("kvwatch --help", [sys.executable, "-m", "kvwatch", "--help"])):
        best, median = wall(argv, runs)
        print(f"{label:22s} min {best * 1e3:7.1f} ms  median {median * 1e3:7.1f} ms  ({runs} runs)")
    print("slowest imports under `import kvwatch.cli` (cumulative):")
    for cumulative, name in slowest_imports("kvwatch.cli"):
        print(f"  {cumulative / 1e3:7.1f} ms  {name}")


if __name__ == "__main__":
    main()
