"""Thread leases with fencing tokens on the PostgreSQL ledger."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from tests.ledger.recorder_contract import turn
from tillerman.ledger.leases import Fenced, check_fence
from tillerman.ledger.postgres import ChangeListener, PostgresRecorder

SHORT = 0.3  # seconds: a lease that lapses within the test


@pytest.fixture
def ledger(postgres_dsn):
    with PostgresRecorder(postgres_dsn) as rec:
        yield rec


def _lapse(lease) -> None:
    """Wait until the server's clock is past the lease's expiry."""
    time.sleep(max(0.0, lease.expires_at - time.time()) + 0.05)


def test_one_owner_at_a_time_and_every_acquisition_bumps_the_token(ledger):
    leases = ledger.leases()
    first = leases.acquire("T", "daemon-a", SHORT)
    assert first is not None and first.token == 1
    assert leases.acquire("T", "daemon-b", SHORT) is None  # held
    assert leases.acquire("T", "daemon-a", SHORT) is None  # held, by the caller too: it renews instead
    assert leases.renew(first, SHORT) is not None
    _lapse(leases.renew(first, SHORT))
    assert leases.renew(first, SHORT) is None  # a lapsed lease is never revived
    second = leases.acquire("T", "daemon-b", 30)
    assert second is not None and second.token == 2
    other_thread = leases.acquire("U", "daemon-a", 30)
    assert other_thread is not None and other_thread.token == 1  # tokens count per thread


def test_a_stale_holders_dispatch_record_is_refused_by_the_fence(ledger):
    leases = ledger.leases()
    stale = leases.acquire("T", "daemon-a", SHORT)
    assert ledger.append([turn(1, thread="T")], durable=True, fence=stale).seqs == (1,)
    _lapse(stale)
    assert not leases.still_held(stale)
    with pytest.raises(Fenced, match="no longer current"):  # lapsed, not yet taken: refused all the same
        ledger.append([turn(2, thread="T")], durable=True, fence=stale)
    current = leases.acquire("T", "daemon-b", 30)
    with pytest.raises(Fenced):
        ledger.append([turn(2, thread="T")], durable=True, fence=stale)
    assert ledger.max_seq() == 1  # nothing of the refused appends
    assert leases.still_held(current)
    assert ledger.append([turn(2, thread="T")], durable=True, fence=current).seqs == (2,)
    again = leases.acquire("T", "daemon-b", 30)
    assert again is None  # b holds it; its own re-acquisition after a lapse would bump the token


def test_a_takeover_waits_for_the_holders_fenced_transaction(ledger, postgres_dsn):
    """The fence's FOR SHARE: while the holder's append transaction is open (its lease
    checked, then lapsing), a takeover's acquisition waits for it to commit; without the
    shared lock the takeover would go ahead and the stale record commit after it."""
    leases = ledger.leases()
    lease = leases.acquire("T", "daemon-a", SHORT)
    taken = []
    with psycopg.connect(postgres_dsn, autocommit=True) as holder:
        with holder.transaction():
            check_fence(holder, lease)
            _lapse(lease)
            taker = threading.Thread(target=lambda: taken.append(leases.acquire("T", "daemon-b", 30)))
            taker.start()
            taker.join(0.5)
            assert taker.is_alive() and taken == []  # waiting on the holder's shared lock
        taker.join(30)
    assert taken[0] is not None and taken[0].token == 2


def test_a_fence_check_that_meets_a_takeover_in_progress_fails(ledger, postgres_dsn):
    """The other order: a takeover has updated the row and not committed yet; the stale
    holder's append waits for it, then reads the new token and is refused."""
    leases = ledger.leases()
    lease = leases.acquire("T", "daemon-a", SHORT)
    _lapse(lease)
    outcome = []

    def stale_append() -> None:
        try:
            ledger.append([turn(1, thread="T")], durable=True, fence=lease)
            outcome.append("written")
        except Fenced:
            outcome.append("fenced")

    with psycopg.connect(postgres_dsn, autocommit=True) as taker:
        with taker.transaction():
            taker.execute("UPDATE leases SET owner = 'daemon-b', token = token + 1,"
                          " expires_at = clock_timestamp() + interval '30 seconds'")
            worker = threading.Thread(target=stale_append)
            worker.start()
            worker.join(0.5)
        worker.join(30)
    assert outcome == ["fenced"] and ledger.max_seq() == 0


def test_another_process_commit_wakes_a_listener(ledger, postgres_dsn):
    with ChangeListener(postgres_dsn) as listener, PostgresRecorder(postgres_dsn) as other:
        assert listener.wait(0.05) is None
        other.append([turn(1), turn(2)])
        assert listener.wait(10) == 2
        with other.bulk():
            other.append([turn(3)])
            other.append([turn(4)])
        assert listener.wait(10) == 4
        lease = other.leases().acquire("T", "x", 30)
        other.leases().release(lease)
        with pytest.raises(Fenced):  # a refused append commits nothing, and notifies no one
            other.append([turn(5)], fence=lease)
        assert listener.wait(0.2) is None


def test_status_lists_every_lease(ledger, postgres_dsn):
    import json

    from click.testing import CliRunner

    from tillerman.controller.cli.main import main

    ledger.leases().acquire("T1", "daemon-a", 30)
    ledger.leases().acquire("T2", "daemon-b", 30)
    result = CliRunner().invoke(main, ["status", "--json", "--ledger", postgres_dsn])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)["leases"]
    assert [(lease["thread"], lease["owner"], lease["token"], lease["held"]) for lease in shown] == [
        ("T1", "daemon-a", 1, True), ("T2", "daemon-b", 1, True)]
    text = CliRunner().invoke(main, ["status", "--ledger", postgres_dsn]).output
    assert "lease: thread T1 held by daemon-a (token 1) until" in text


def test_a_ledger_made_before_the_daemons_table_gets_it_from_a_writer(postgres_dsn):
    with PostgresRecorder(postgres_dsn) as ledger, ledger._transaction() as conn:
        conn.execute("DROP TABLE daemons")
    with PostgresRecorder(postgres_dsn) as ledger:
        ledger.leases().beat("host:1:a", "host", 1, 5.0)
        assert [d["id"] for d in ledger.leases().daemons()] == ["host:1:a"]
