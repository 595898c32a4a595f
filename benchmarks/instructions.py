"""Parse + read in CPU instructions, not seconds: kvwatch's typical poll against prometheus_client's parser.

Wall time on a shared machine moves with the load (docs/performance.md); instruction counts do not. This
runs each side under ``valgrind --tool=callgrind`` twice, with 0 and with N calls after two warm-up calls,
and divides the difference by N, so the interpreter's start-up and imports cancel out. The payloads are
bench_parser.py's (8-engine vLLM 0.33). Instructions are not time (a C scan retires more of them per cycle
than the interpreter does), so the ratio here is a reproducible companion to the timed one, not a substitute.

    .venv/bin/python benchmarks/instructions.py                  # all three payloads (~6 min)
    .venv/bin/python benchmarks/instructions.py sim --src REV_SRC   # kvwatch from another checkout's src/

Needs valgrind (Debian package ``valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CALLS = {"kvwatch": 20, "prometheus_client": 3, "floor": 20}  # prometheus_client is ~50x slower: fewer calls suffice


def run(payload: str, side: str, calls: int) -> None:
    """The measured process: two warm-up calls, then ``calls`` more."""
    sys.path.insert(0, str(HERE))
    from bench_parser import PAYLOADS, FloorPoll, kvwatch_poll, prometheus_client_parse

    text = PAYLOADS[payload]()
    fn = {"kvwatch": kvwatch_poll, "prometheus_client": prometheus_client_parse, "floor": FloorPoll(text)}[side]
    for _ in range(2 + calls):
        fn(text)


def instructions(payload: str, side: str, calls: int, src: Path | None) -> int:
    """Instructions callgrind counts for the whole process."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
         "--run", payload, side, str(calls)], env=env, capture_output=True, text=True, check=True).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise SystemExit(f"no callgrind total in:\n{out}")
    return int(found.group(1))


def per_call(payload: str, side: str, src: Path | None) -> float:
    calls = CALLS[side]
    return (instructions(payload, side, calls, src) - instructions(payload, side, 0, src)) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("payloads", nargs="*", default=["fixture", "sim", "bench"])
    parser.add_argument("--floor", action="store_true",
                        help="also count bench_parser.FloorPoll, the least any CPython reader could do")
    parser.add_argument("--src", type=Path, help="import kvwatch from this src/ directory (another revision)")
    parser.add_argument("--run", nargs=3, metavar=("PAYLOAD", "SIDE", "CALLS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        payload, side, calls = args.run
        run(payload, side, int(calls))
        return
    print("payload   prometheus_client   kvwatch parse+read   ratio" + ("   floor   ratio" if args.floor else ""))
    for payload in args.payloads:
        theirs = per_call(payload, "prometheus_client", None)
        ours = per_call(payload, "kvwatch", args.src)
        line = f"{payload:8s} {theirs / 1e6:14.1f} M {ours / 1e6:17.2f} M {theirs / ours:9.1f}x"
        if args.floor:
            least = per_call(payload, "floor", None)
            line += f" {least / 1e6:6.2f} M {theirs / least:6.1f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
