"""``tillerman run`` on a PostgreSQL ledger whose server goes away: a restart
(``pg_ctl -m fast stop``, then start), the daemon's connections dropped
(``pg_terminate_backend``), and a failover (a new server on a copy of the data, on the
same socket). The daemon says so once, holds what it observed, retries, never exits,
records everything it held once the database answers, and listens for commits again.
Its URL carries a password; no line it prints shows it. The leases still decide: a
daemon whose lease lapsed while it was away decides nothing for that thread until it
holds it again.

Each test has a server of its own (stopping the run's shared one would fail other
tests)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from fixtures.postgres_server import ThrowawayPostgres
from tests.conftest import require_postgres
from tests.monitor.tailer_support import THREAD, append, rollout_line, rollout_name, session_meta
from tillerman.controller.core.intent_requests import propose
from tillerman.ledger import events as ev
from tillerman.ledger.errors import OperationalError
from tillerman.ledger.leases import Leases
from tillerman.ledger.postgres import CHANNEL, PostgresRecorder

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3kr1t-outage"  # trust authentication ignores it; it must show nowhere
LEASE = 2.0


@pytest.fixture
def server() -> Iterator[ThrowawayPostgres]:
    require_postgres()
    pg = ThrowawayPostgres().start()
    try:
        yield pg
    finally:
        pg.stop()


class Run:
    """``tillerman run --no-codex --watch`` on the server's database, its stderr in a file."""

    def __init__(self, server: ThrowawayPostgres, tmp_path: Path, *extra: str) -> None:
        self.dsn = server.create_database("tm")
        PostgresRecorder(self.dsn).close()  # the ledger's tables, for the probes before the daemon writes
        self.sessions = tmp_path / "sessions"
        self.sessions.mkdir()
        self.rollout = self.sessions / rollout_name()
        append(self.rollout, session_meta())
        self.log = tmp_path / "daemon.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tillerman", "run", "--no-codex", "--watch", str(self.sessions), "-v",
             "--ledger", f"{self.dsn}&password={SECRET}", *extra],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"))
        self.lines = 0

    def say(self, count: int) -> None:
        """``count`` more agent messages in the session file."""
        for _ in range(count):
            self.lines += 1
            append(self.rollout, rollout_line(self.lines))

    def recorded(self) -> int:
        """The session file's agent messages the ledger holds."""
        with contextlib.closing(PostgresRecorder(self.dsn, readonly=True)) as ledger:
            return sum(isinstance(e.envelope.event, ev.AgentMessage) for e in ledger.read())

    def text(self) -> str:
        return self.log.read_text()

    def until(self, probe: Callable[[], object], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not _quietly(probe):
            assert self.process.poll() is None, f"the daemon exited ({self.process.returncode}):\n{self.text()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.text()}"
            time.sleep(0.2)

    def listening(self) -> bool:
        """A session of this database waits on the ledger's channel (the daemon's listener)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                " AND query = %s", (f"LISTEN {CHANNEL}",)).fetchone()[0] > 0

    def status(self) -> dict:
        done = subprocess.run([sys.executable, "-m", "tillerman", "status", "--json", "--ledger", self.dsn],
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def stop(self) -> str:
        self.process.terminate()
        assert self.process.wait(30) == 0, self.text()
        return self.text()


def _quietly(probe: Callable[[], object]) -> object:
    try:
        return probe()
    except (psycopg.Error, OperationalError, OSError):  # the server is away: not yet
        return False


@pytest.fixture
def daemon(server: ThrowawayPostgres, tmp_path: Path) -> Iterator[Run]:
    run = Run(server, tmp_path)
    try:
        run.say(2)
        run.until(lambda: run.recorded() == 2 and run.listening(), "the daemon to record and listen")
        yield run
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()


def _terminate_others(dsn: str) -> int:
    """End every other session of the database (the daemon's pool and listener)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return _terminate(conn, "tm", spare=conn.info.backend_pid)


def _terminate(conn: psycopg.Connection, database: str, spare: int) -> int:
    return len(conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                            " WHERE datname = %s AND pid <> %s", (database, spare)).fetchall())


def _outage_said_once(log: str) -> None:
    assert log.count("ledger not writable") == 1, log
    assert log.count("ledger reachable again") >= 1, log
    assert "Traceback" not in log and SECRET not in log, log


def _away(daemon: Run, server: ThrowawayPostgres, come_back: Callable[[], None]) -> None:
    """The server halted; observations made meanwhile; ``come_back``; all of them recorded."""
    server.halt()
    daemon.say(3)
    time.sleep(3.0)  # the daemon tries, fails, and holds them
    assert daemon.process.poll() is None, daemon.text()
    come_back()
    daemon.say(1)
    daemon.until(lambda: daemon.recorded() == 6, "what was held to be recorded")
    daemon.until(daemon.listening, "the daemon to listen again")


def test_a_server_restart_is_waited_out_and_nothing_observed_meanwhile_is_lost(daemon, server):
    _away(daemon, server, lambda: server.serve(server.data))
    daemon.until(lambda: (daemon.status()["daemon"]["ledger_outage"] or {}).get("until"),
                 "the heartbeat to show the outage")
    outage = daemon.status()["daemon"]["ledger_outage"]
    assert outage["since"] < outage["until"] and "PostgreSQL" in outage["error"]
    _outage_said_once(daemon.stop())


def test_a_failover_to_a_new_server_on_the_same_url_is_waited_out(daemon, server):
    def failover():
        server.serve(server.failover_copy())  # another postmaster, another data folder, the same socket

    _away(daemon, server, failover)
    _outage_said_once(daemon.stop())


def test_dropped_connections_are_made_again(daemon):
    assert _terminate_others(daemon.dsn) >= 2  # the pool's and the listener's
    daemon.say(2)
    daemon.until(lambda: daemon.recorded() == 4, "the observations after the drop to be recorded")
    daemon.until(daemon.listening, "the daemon to listen again")
    assert _terminate_others(daemon.dsn) >= 1  # twice: each drop is one outage, said once
    daemon.say(1)
    daemon.until(lambda: daemon.recorded() == 5, "the observations after the second drop to be recorded")
    log = daemon.stop()
    assert "Traceback" not in log and SECRET not in log, log
    assert log.count("ledger not writable") <= 2, log


@contextlib.contextmanager
def _own_connection(dsn: str) -> Iterator[tuple[psycopg.Connection, Leases]]:
    """Another daemon's leases, through one connection made now: it stays while new
    ones are refused."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        @contextlib.contextmanager
        def transaction():
            with conn.transaction():
                yield conn

        @contextlib.contextmanager
        def statement():
            yield conn

        yield conn, Leases(transaction, statement)


def _lease(dsn: str) -> dict | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT owner, token, expires_at > clock_timestamp() FROM leases WHERE thread_id = %s",
                           (THREAD.encode(),)).fetchone()
    return None if row is None else {"owner": row[0], "token": row[1], "held": row[2]}


def _state(dsn: str, intent_id: str) -> str | None:
    with contextlib.closing(PostgresRecorder(dsn, readonly=True)) as ledger:
        return next((e.envelope.event.to_state for e in reversed(ledger.intent_entries(intent_id))
                     if isinstance(e.envelope.event, ev.IntentTransition)), "proposed")


def test_a_lease_lost_while_away_is_not_acted_on_until_taken_again(server, tmp_path):
    run = Run(server, tmp_path, "--lease", f"{LEASE:g}s")
    try:
        run.say(1)
        run.until(lambda: (_lease(run.dsn) or {}).get("held"), "the daemon to take the thread's lease")
        first = _lease(run.dsn)
        with _own_connection(run.dsn) as (conn, other), psycopg.connect(server.dsn(), autocommit=True) as admin:
            # The daemon cut off (its sessions ended, no new one admitted) for longer than its lease.
            admin.execute('ALTER DATABASE "tm" WITH ALLOW_CONNECTIONS false')
            _terminate(admin, "tm", spare=conn.info.backend_pid)
            run.until(lambda: "lost the lease on thread" in run.text(), "the daemon to give its lease up", 30)
            taken = other.acquire(THREAD, "another-daemon", 3 * LEASE)
            assert taken is not None and taken.token > first["token"]
            admin.execute('ALTER DATABASE "tm" WITH ALLOW_CONNECTIONS true')
        # An intent for the thread while another daemon holds it: back, this one decides nothing.
        with contextlib.closing(PostgresRecorder(run.dsn)) as ledger:
            intent = propose(ledger, thread_id=THREAD, mode="queue", text="held back", owner="owner",
                             expected_turn=None)
        run.until(lambda: "ledger reachable again" in run.text(), "the daemon to reach its ledger again")
        time.sleep(LEASE)
        assert _state(run.dsn, intent.id) == "proposed" and _lease(run.dsn)["owner"] == "another-daemon"
        # The other daemon's lease runs out: this one takes the thread anew, then decides.
        run.until(lambda: _lease(run.dsn)["owner"] != "another-daemon", "the daemon to take the thread again",
                  4 * LEASE + 30)
        assert _lease(run.dsn)["token"] > taken.token
        run.until(lambda: _state(run.dsn, intent.id) != "proposed", "the daemon to decide the intent")
        log = run.stop()
        assert "Traceback" not in log and SECRET not in log, log
    finally:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()
