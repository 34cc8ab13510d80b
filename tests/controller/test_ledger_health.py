"""An outage of the daemon's ledger is said once when it begins and once when it ends."""

from __future__ import annotations

from tillerman.controller.daemon.ledger_health import LedgerHealth


def test_an_outage_begins_once_and_ends_once():
    health = LedgerHealth()
    assert health.recovered(1.0) is None  # nothing to end
    assert health.failed("server closed the connection", 2.0) is True
    assert health.failed("connection refused", 3.0) is False  # the same outage, met again
    ended = health.recovered(5.0)
    assert (ended.since, ended.until, ended.error) == (2.0, 5.0, "server closed the connection")
    assert health.recovered(6.0) is None and health.last == ended
    assert health.failed("again", 7.0) is True and health.last.until is None
