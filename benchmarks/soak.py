"""Accelerated soak: a day of simulated vLLM traffic through a real ``kvwatch serve`` in minutes.

``kvwatch simulate`` (the demo's engine and load) runs ``--speed`` times faster than real time and kvwatch's
clock follows it (``--clock-speed``), polling every 30 simulated seconds. Every ``--sample-seconds`` the soak
reads kvwatch's RSS and open files from /proc and its CPU time (utime + stime), and prints CPU per poll for
each window: flat lines mean nothing grows with the history (docs/reliability.md has a run's figures).

    .venv/bin/python benchmarks/soak.py                         # 24 simulated hours in 10 minutes (x144)
    .venv/bin/python benchmarks/soak.py --simulated-hours 1 --wall-minutes 1
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import httpx

from kvwatch.demo import serve_argv, simulator_argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stat(pid: int) -> tuple[float, float, int]:
    """(RSS MB, CPU seconds, open files) of a process."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu, len(os.listdir(f"/proc/{pid}/fd"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulated-hours", type=float, default=24.0)
    parser.add_argument("--wall-minutes", type=float, default=10.0)
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--poll-simulated-seconds", type=float, default=30.0,
                        help="simulated seconds between polls (the demo's 10 s is too fast for a loaded 2-core box "
                        "at x144: the simulator itself then answers late)")
    args = parser.parse_args(argv)
    speed = args.simulated_hours * 3600 / (args.wall_minutes * 60)
    interval = args.poll_simulated_seconds / speed
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    sim_port, kv_port = free_port(), free_port()
    sim = subprocess.Popen([sys.executable, "-m", "kvwatch", "simulate", *simulator_argv(speed, sim_port)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kv = subprocess.Popen([sys.executable, "-m", "kvwatch", "serve",
                           *serve_argv(f"http://127.0.0.1:{sim_port}/metrics", kv_port, speed, interval)],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(f"x{speed:g}: {args.simulated_hours:g} simulated hours in {args.wall_minutes:g} min, a poll every "
          f"{interval * 1000:.0f} ms ({args.poll_simulated_seconds:g} simulated s)")
    print("| wall min | simulated h | RSS MB | open files | CPU ms per scheduled poll (window) | kvwatch_up "
          "| scrape errors (total) |")
    print("|---|---|---|---|---|---|---|")
    try:
        started = time.monotonic()
        last_cpu, last_t = stat(kv.pid)[1], started
        while time.monotonic() - started < args.wall_minutes * 60:
            time.sleep(args.sample_seconds)
            rss, cpu, fds = stat(kv.pid)
            now = time.monotonic()
            polls = (now - last_t) / interval
            try:
                text = httpx.get(f"http://127.0.0.1:{kv_port}/metrics", timeout=5).text
                up = next((line.split()[1] for line in text.splitlines() if line.startswith("kvwatch_up ")), "?")
                # Failed polls by any reason: a soak whose target cannot keep up measures nothing.
                failed = sum(float(line.split()[-1]) for line in text.splitlines()
                             if line.startswith("kvwatch_scrape_errors_total{"))
                errors = f"{failed:g}"
            except httpx.HTTPError:
                up, errors = "scrape failed", "?"
            print(f"| {(now - started) / 60:.1f} | {(now - started) * speed / 3600:.1f} | {rss:.1f} | {fds} | "
                  f"{1000 * (cpu - last_cpu) / polls:.2f} | {up} | {errors} |", flush=True)
            last_cpu, last_t = cpu, now
    finally:
        for proc in (kv, sim):
            proc.terminate()
            proc.wait(timeout=10)
        log = kv.stdout.read() if kv.stdout else ""
        print(f"kvwatch log: {len(log.splitlines())} lines, {log.count('Traceback')} tracebacks")
        print("\n".join(log.splitlines()[-6:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
