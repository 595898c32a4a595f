"""kvwatch.stop_signals: the main thread waits for SIGTERM/SIGINT with no lock a handler could deadlock on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from kvwatch.stop_signals import StopSignals


def test_a_signal_ends_the_wait_and_the_previous_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        assert stop.wait(0.05) is False and stop.received is None  # the timeout, nothing received
        os.kill(os.getpid(), signal.SIGTERM)
        started = time.monotonic()
        assert stop.wait(5) is True and stop.received == signal.SIGTERM
        assert time.monotonic() - started < 1
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("command", [["simulate", "--port", "0"],
                                     ["serve", "--target-url", "http://127.0.0.1:9/metrics", "--port", "0"]])
def test_sigint_and_sigterm_together_stop_the_process(command: list[str]) -> None:
    # A Ctrl-C on `kvwatch demo` sends both to its children milliseconds apart; a handler that set
    # a threading.Event could deadlock the main thread inside Event.wait, and the demo killed them after 5 s.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    for first, second in ((signal.SIGINT, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)):
        proc = subprocess.Popen([sys.executable, "-m", "kvwatch", *command], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env)
        assert proc.stdout is not None
        proc.stdout.readline()  # the first line: it is up
        proc.send_signal(first)
        proc.send_signal(second)
        try:
            assert proc.wait(timeout=10) == 0
        finally:
            proc.kill()
            proc.communicate()
