"""Waiting in the main thread for a stop signal, with nothing a signal handler can deadlock on.

A handler that calls ``threading.Event.set()`` can hang the process: Python runs the handler in the main thread
between two bytecodes, and when that thread is inside ``Event.wait`` holding the event's own lock, ``set`` waits for
that lock forever. SIGINT and SIGTERM a few milliseconds apart (a Ctrl-C on ``kvwatch demo``, which also stops its
children) hung ``simulate`` and ``serve`` in 1 of 3 to 8 tries. Here the handler only stores the
signal's number, which takes no lock, and the main thread looks at it every ``tick`` seconds.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

TICK_SECONDS = 0.1
"""How often :meth:`StopSignals.wait` looks for a signal: the most a stop is delayed by."""


class StopSignals:
    """While installed (:meth:`install`, or as a context manager), each of ``signals`` records itself in
    :attr:`received`; :meth:`wait` returns once one has. :meth:`restore` puts the previous handlers back. Main thread
    only, as every signal handler."""

    def __init__(self, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
                 tick: float = TICK_SECONDS) -> None:
        self.signals = tuple(signals)
        self.tick = tick
        self.received: int | None = None
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> StopSignals:
        self._previous = {s: signal.signal(s, self._record) for s in self.signals}
        return self

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, *_: object) -> None:
        self.restore()

    def _record(self, number: int, _frame: FrameType | None) -> None:
        self.received = number

    def wait(self, timeout: float | None = None) -> bool:
        """True once a signal came, False when ``timeout`` seconds passed first (None: no timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.received is None:
            left = self.tick if deadline is None else min(self.tick, deadline - time.monotonic())
            if left <= 0:
                return False
            time.sleep(left)
        return True
