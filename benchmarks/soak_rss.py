"""Sidecar memory over a long demo: runs ``kvwatch demo`` and samples the ``kvwatch serve`` child's RSS.

The demo polls every 10 simulated seconds; at ``--speed 60`` one wall minute is one simulated hour, and the
sidecar's windows are full after two simulated hours (the forecaster's 120 minute buckets; the history keeps
the last 300 s of polls), so the later samples are its steady state. Prints one line per sample (wall seconds, simulated
hours, VmRSS, load average) and the median of the last third.

It first compiles kvwatch's bytecode, as ``pip install`` does for the image: with PYTHONDONTWRITEBYTECODE
set and no ``.pyc`` on disk, every start would compile the sources again, and the compiler's peak (~1.4 MB)
stays in the process's RSS.

    .venv/bin/python benchmarks/soak_rss.py --speed 60 --minutes 12
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def compile_kvwatch() -> None:
    """Write kvwatch's ``.pyc`` files (compileall writes them even under PYTHONDONTWRITEBYTECODE)."""
    spec = importlib.util.find_spec("kvwatch")
    assert spec is not None and spec.submodule_search_locations, "kvwatch is not installed"
    subprocess.run([sys.executable, "-m", "compileall", "-q", *spec.submodule_search_locations], check=True)


def serve_child(demo_pid: int) -> int | None:
    """The ``kvwatch serve`` process the demo started."""
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
            cmdline = (status.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == demo_pid and b"serve" in cmdline:
            return int(status.parent.name)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--speed", type=float, default=60.0)
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--every", type=float, default=20.0, help="wall seconds between samples")
    args = parser.parse_args()
    compile_kvwatch()
    demo = subprocess.Popen([sys.executable, "-m", "kvwatch", "demo", "--clock-speed", str(args.speed), "--port", "0",
                             "--sim-port", "0", "--status-interval-seconds", "60",
                             "--duration-seconds", str(args.minutes * 60)], stdout=subprocess.DEVNULL)
    started = time.monotonic()
    pid = None
    series: list[tuple[float, float]] = []
    try:
        while demo.poll() is None:
            time.sleep(args.every)
            pid = pid or serve_child(demo.pid)
            rss = rss_mb(pid) if pid else None
            if rss is None:
                continue
            elapsed = time.monotonic() - started
            series.append((elapsed, rss))
            load = Path("/proc/loadavg").read_text().split()[0]
            print(f"{elapsed:6.0f} s  {elapsed * args.speed / 3600:6.2f} sim h  {rss:6.1f} MB  load {load}",
                  flush=True)
    finally:
        if demo.poll() is None:
            demo.terminate()
            demo.wait(30)
    tail = [rss for _, rss in series[len(series) * 2 // 3:]]
    if tail:
        print(f"steady (median of the last third): {statistics.median(tail):.1f} MB; "
              f"max over the run {max(r for _, r in series):.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
