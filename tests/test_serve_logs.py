"""kvwatch.serve.logs: logging never waits for stderr (the end-to-end case is in test_serve_e2e.py)."""

from __future__ import annotations

import logging
import os
import queue

from kvwatch.serve.logs import DroppingQueueHandler, StderrWriter


def test_a_full_queue_drops_and_the_next_record_through_says_how_many() -> None:
    records: queue.Queue[logging.LogRecord] = queue.Queue(2)
    handler = DroppingQueueHandler(records)
    log = logging.getLogger("kvwatch.test.logs")
    log.propagate = False
    log.addHandler(handler)
    try:
        for i in range(5):
            log.warning("line %d", i)  # returns at once: the queue holds 2, three are dropped
        assert handler.dropped == 3
        assert [records.get_nowait().getMessage() for _ in range(2)] == ["line 0", "line 1"]
        log.warning("after")
        assert [records.get_nowait().getMessage() for _ in range(2)] == [
            "3 log records dropped: stderr was not read", "after"]
        assert handler.dropped == 0
    finally:
        log.removeHandler(handler)


def test_the_writer_writes_whole_lines_to_its_descriptor_without_a_lock() -> None:
    read_end, write_end = os.pipe()
    try:
        writer = StderrWriter(write_end)
        assert writer.lock is None  # nothing for logging.shutdown to wait on at exit
        writer.handle(logging.makeLogRecord({"name": "kvwatch", "levelname": "INFO", "levelno": logging.INFO,
                                             "msg": "polling é"}))
        line = os.read(read_end, 1000).decode()
        assert line.endswith(" INFO kvwatch: polling é\n")
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_messages_control_characters_are_escaped_and_a_traceback_keeps_its_lines() -> None:
    # A model name from the target's page (a label) with a newline forged a log line of its own, and a terminal
    # escape in it drove whoever tailed the log.
    read_end, write_end = os.pipe()
    try:
        writer = StderrWriter(write_end)
        try:
            raise ValueError("boom")
        except ValueError as exc:
            error = exc
        writer.handle(logging.makeLogRecord({
            "name": "kvwatch", "levelname": "ERROR", "levelno": logging.ERROR,
            "msg": "capacity model for %s", "args": ('evil"} 1\nINJECTED 42\x1b[2J é',),
            "exc_info": (ValueError, error, error.__traceback__)}))
        text = os.read(read_end, 10_000).decode()
    finally:
        os.close(read_end)
        os.close(write_end)
    first, *rest = text.splitlines()
    assert first.endswith('capacity model for evil"} 1\\nINJECTED 42\\x1b[2J é')
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"
