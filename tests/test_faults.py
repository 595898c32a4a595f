"""A fast subset of the fault matrix (benchmarks/faults.py): a real ``kvwatch serve`` against a loopback
target that goes down, bombs it with gzip, serves impossible values, or is scraped 500 times at once.
The whole matrix, with its table, is ``python benchmarks/faults.py`` (docs/reliability.md)."""

from __future__ import annotations

from typing import Any

import pytest

from repo_scripts import load_script

pytestmark = pytest.mark.e2e


faults = load_script("benchmarks/faults.py", "kvwatch_faults")


@pytest.fixture(scope="module")
def target() -> Any:
    t = faults.Target()
    yield t
    t.down()


@pytest.mark.parametrize("fault", ["down", "gzip_bomb", "html", "nan"])
def test_fault_is_survived_withdrawn_recovered_and_sigterm_is_prompt(fault: str, target: Any) -> None:
    row = faults.run_fault(fault, target)
    assert row.survived, row
    assert row.stale_withdrawn == "yes" and row.recovered, row
    assert row.up_during == ("1" if fault in faults.VALUE_FAULTS else "0"), row
    assert row.sigterm_exit_s is not None and row.sigterm_exit_s < 5, row  # docs/reliability.md has the figures
    # RSS is bounded by the body cap (16 MiB) on top of the ~50 MB the process needs anyway.
    assert row.peak_rss_mb < 100 and row.rss_after_heal_mb < row.peak_rss_mb + 1, row


def test_bad_config_exits_2_with_one_line(target: Any) -> None:
    row = faults.run_fault("bad_config", target)
    assert row.survived, row


def test_500_concurrent_scrapes_all_answered(target: Any) -> None:
    target.mode = "good"
    kv = faults.Kvwatch(target.port)
    try:
        assert kv.wait_for(faults.healthy, 20)
        errors, _p99 = faults.concurrent_scrapes(kv.port, 500)  # latency: benchmarks/faults.py, not asserted here
        assert errors == 0
        assert kv.sigterm() < 5
        assert "Traceback" not in kv.log()
    finally:
        kv.close()


def test_the_targets_down_refuses_connections_and_it_can_listen_again() -> None:
    # close() alone left accept() blocked and the port listening: the next poll was answered "good" and listening
    # on the port again failed (Address already in use) until a connection came.
    import socket
    import time

    t = faults.Target()
    try:
        time.sleep(0.1)  # its accept() is blocked by now
        t.down()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", t.port), timeout=2).close()
        t.listen()
        socket.create_connection(("127.0.0.1", t.port), timeout=2).close()
    finally:
        t.down()
