"""The sidecar's log: nothing that logs ever waits for stderr.

A container runtime whose log pipe is not read (a collector that fell behind) fills it, and a plain
StreamHandler then blocks the thread that logs: the poll thread stopped polling with ``kvwatch_up`` frozen,
and SIGTERM hung on "shutting down". Records go to a bounded queue instead, written out by
one daemon thread with ``os.write`` (no Python buffer or lock another thread could wait on at exit); when the
queue is full a record is dropped and counted, and the next record that gets through says how many were.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import queue
import sys
from typing import TextIO

from kvwatch.exposition import printable

QUEUE_RECORDS = 1_000  # about 0.6 MB of waiting records (6 MB at 10,000, tracemalloc)
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """Puts records on a bounded queue without waiting; counts what did not fit."""

    def __init__(self, records: queue.Queue[logging.LogRecord]) -> None:
        super().__init__(records)
        self.dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            if self.dropped:
                note = logging.makeLogRecord({"name": "kvwatch", "levelno": logging.WARNING, "levelname": "WARNING",
                                              "msg": f"{self.dropped} log records dropped: stderr was not read"})
                self.queue.put_nowait(self.prepare(note))
                self.dropped = 0
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1


class EscapingFormatter(logging.Formatter):
    """A log line's message with its control characters escaped (kvwatch.exposition.printable): a label the target
    sets (a model name holding a newline or a terminal escape) forged log lines or drove the terminal. Tracebacks keep
    their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


class StderrWriter(logging.Handler):
    """Writes formatted records to file descriptor 2 from the queue's one thread: no lock (a lock held by a
    write blocked on a full pipe would stall ``logging.shutdown`` at exit) and no buffer to flush."""

    def __init__(self, fd: int = 2) -> None:
        super().__init__()
        self.fd = fd
        self.setFormatter(EscapingFormatter(FORMAT))

    def createLock(self) -> None:
        self.lock = None  # only the queue's thread writes

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "replace")
            while data:
                data = data[os.write(self.fd, data):]
        except OSError:
            pass  # stderr closed: nowhere to say so

    def flush(self) -> None:
        pass


def setup(level: str) -> logging.handlers.QueueListener | None:
    """Route the root logger through the queue; returns the started listener (its thread is a daemon). Like
    ``logging.basicConfig``, nothing when the root logger has handlers already (a test's capture, an embedder's)."""
    root = logging.getLogger()
    if root.handlers:
        return None
    records: queue.Queue[logging.LogRecord] = queue.Queue(QUEUE_RECORDS)
    root.addHandler(DroppingQueueHandler(records))
    root.setLevel(level)
    listener = logging.handlers.QueueListener(records, StderrWriter(sys.stderr.fileno()))
    listener.start()
    return listener


def nonblocking_stderr() -> TextIO:
    """A file on stderr whose writes fail instead of waiting (for faulthandler's last-resort exit, which must not
    wait on a full pipe either): a new open of the same pipe, so stderr itself stays blocking (appending, should
    stderr be a file). stderr itself where it cannot be opened again (no /proc, a socket)."""
    try:
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_APPEND
        return os.fdopen(os.open(f"/proc/self/fd/{sys.stderr.fileno()}", flags), "w")
    except OSError:
        return sys.stderr
