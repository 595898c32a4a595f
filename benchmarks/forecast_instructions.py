"""The forecast's cost in CPU instructions per poll, not seconds: ``Forecaster.observe`` on one series.

bench_forecast_cpu.py times the forecast in process CPU seconds, which move with the machine's load
(docs/performance.md); instruction counts do not. This simulates bench_forecast_cpu.py's poll stream once
(cached in a pickle), then runs the forecaster over its first ``--hours`` under ``valgrind --tool=callgrind``
twice, once observing every poll and once only loading them, and divides the difference by the number of
polls. ``--src`` imports kvwatch from another checkout's ``src/`` (the same polls), for a before/after.
Instructions are not time: compare revisions with it, and read time from bench_forecast_cpu.py.

    .venv/bin/python benchmarks/forecast_instructions.py                      # this checkout
    .venv/bin/python benchmarks/forecast_instructions.py --src /tmp/old/src   # another revision

Needs valgrind (Debian package ``valgrind``).
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLLS = Path(tempfile.gettempdir()) / "kvwatch-forecast-polls.pickle"


def run(polls: Path, hours: float, observe: bool) -> None:
    """The measured process: load the polls, observe the first ``hours`` of them (or not)."""
    from kvwatch.forecast import Forecaster

    samples = pickle.loads(polls.read_bytes())
    samples = [s for s in samples if s.timestamp - samples[0].timestamp < hours * 3600.0]
    if observe:
        forecaster = Forecaster()
        for sample in samples:
            forecaster.observe(sample)
    print(f"polls={len(samples)}")


def instructions(polls: Path, hours: float, observe: bool, src: Path | None) -> tuple[int, int]:
    """(instructions callgrind counts for the whole process, polls observed)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
         "--run", str(polls), str(hours), "1" if observe else "0"], env=env, capture_output=True, text=True,
        check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    count = re.search(r"polls=(\d+)", done.stdout)
    if found is None or count is None:
        raise SystemExit(f"no callgrind total or poll count in:\n{done.stdout}\n{done.stderr}")
    return int(found.group(1)), int(count.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=4.0, help="hours of 10-s polls to observe (default 4)")
    parser.add_argument("--src", type=Path, help="import kvwatch from this src/ directory (another revision)")
    parser.add_argument("--run", nargs=3, metavar=("POLLS", "HOURS", "OBSERVE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run(Path(args.run[0]), float(args.run[1]), args.run[2] == "1")
        return
    if not POLLS.exists():
        sys.path.insert(0, str(HERE))
        from bench_forecast_cpu import polls

        POLLS.write_bytes(pickle.dumps(polls()))
    total, count = instructions(POLLS, args.hours, True, args.src)
    base, _ = instructions(POLLS, args.hours, False, args.src)
    print(f"{count} polls ({args.hours:g} h of one series): {(total - base) / count / 1e3:.0f} k instructions "
          f"per poll, {(total - base) / 1e6:.0f} M in all")


if __name__ == "__main__":
    main()
