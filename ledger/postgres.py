"""The PostgreSQL ledger: the same rows, chain and rules as ``tillerman.ledger.sqlite``,
in a database several machines can share (psycopg 3, a small connection pool).

Sequencing: one row, ``chain_head``, holds the last seq and its hash. Every append
locks it (``SELECT … FOR UPDATE``) first thing in its transaction, prepares its rows on
that head (``tillerman.ledger.batch.prepare``: duplicates, conflicts, the intent table
checked against what is stored), inserts them and moves the row on, then commits. A
second writer waits on the lock, and under READ COMMITTED its next statement sees the
first one's rows: seqs are contiguous, in commit order, with no gap (a sequence object
would leave one at every rollback) — a reader that saw seq N has seen every seq before
it. The lock is held for one append's round trips (about a millisecond); an advisory
lock would serialize the same way, but then the head must be found with a
``max(seq)`` lookup and kept nowhere.

The anchor: there is no file beside a database, so the head row is the anchor. It moves
in the same transaction as the rows, so it never lags. Every append checks, under the
lock, that the table still ends at the row it names, and refuses to write on top of a
cut tail (``AnchorMismatch``, until ``accept_tail``); ``verify`` reports a table that ends
before it, or runs past it (rows written around the recorder). A trigger refuses
``UPDATE``, ``DELETE`` and ``TRUNCATE`` on ``events``. What this guards against: a careless
hand or a buggy tool deleting or editing rows, a restore of the events table alone. What
it cannot: whoever may disable the trigger and rewrite both the rows and the head row,
or a restore of the whole database to an earlier point — both look like a shorter,
consistent history (compare a saved ``ledger verify`` head to detect that).

Several daemons: thread leases and the fence on a dispatch record
(``tillerman.ledger.leases``, ``append(…, fence=lease)``), and a notification on
``CHANNEL`` with the last seq of every commit that adds rows (``ChangeListener``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence

import psycopg
import psycopg_pool

from tillerman.ledger import events, leases
from tillerman.ledger.batch import Row, entry_of, prepare, row_columns
from tillerman.ledger.changes import ListenerFeed
from tillerman.ledger.errors import AnchorMismatch, IntegrityError, OperationalError, SchemaError
from tillerman.ledger.events import Entry, Envelope, TailAccepted
from tillerman.ledger.file_offsets import FileOffset
from tillerman.ledger.intent_states import State, known_state
from tillerman.ledger.location import shown
from tillerman.ledger.recorder import CHAIN_VERSION, GENESIS, AppendResult, Recorder, VerifyReport
from tillerman.ledger.sqlite import ACCEPT_TAIL
from tillerman.ledger.verify import verify_ledger

SCHEMA_VERSION = 1
#: ``offset`` is a reserved word in PostgreSQL: quoted, the same columns as SQLite's.
COLUMNS = ("seq, event_id, at, observed_at, source, thread_id, turn_id, kind, intent_id,"
           ' "offset", length, payload, digest, prev_hash, hash')
_INSERT = f"INSERT INTO events ({COLUMNS}) VALUES ({', '.join(['%s'] * 15)})"
_COPY = f"COPY events ({COLUMNS}) FROM STDIN"
#: The columns that hold names from the outside world (ids, sources): BYTEA, UTF-8 of the
#: exact string, since PostgreSQL's TEXT cannot hold a NUL or a lone surrogate, and a
#: ledger stores what it was given.
_NAMES = (1, 4, 5, 6, 8)
_PAYLOAD = 11
_SETUP_LOCK = 7_470_581_331  # the advisory lock two processes creating the schema take in turn
_COPY_FROM = 16  # rows from which a batch is sent with COPY
_PAGE = 1000  # rows per read round trip
#: Connections per recorder: a ``bulk()`` block holds one while reads use another.
POOL_SIZE = 4
#: Seconds a statement waits for a pooled connection: while the server answers, long
#: enough for any other statement of this process to finish; once it stopped answering
#: (a restart, a failover, a dropped connection), short, so that the daemon's loop is
#: never held by a wait whose answer is already known, and says so and retries instead.
WAIT_FOR_CONNECTION = 30.0
#: Seconds a writer's transaction may sit idle before the server ends it (and the
#: session). A block (``bulk``) holds the head row for a whole decision round, a few
#: milliseconds; a process frozen inside one (SIGSTOP, a paused VM, a swap storm) would
#: hold every other writer on the ledger — every other daemon — for as long as it stays
#: frozen, leases or not. Ended, its rows roll back; woken, it finds its connection gone
#: and reads the ledger again, and its lease's fence refuses what it no longer owns. A
#: daemon sets its lease length instead: frozen longer, it has lost its threads anyway.
IDLE_TRANSACTION_LIMIT = 20.0
WAIT_WHILE_UNREACHABLE = 0.2

SCHEMA = (
    """CREATE TABLE events (
        seq BIGINT PRIMARY KEY,
        event_id BYTEA NOT NULL UNIQUE,
        at DOUBLE PRECISION,
        observed_at DOUBLE PRECISION NOT NULL,
        source BYTEA NOT NULL,
        thread_id BYTEA,
        turn_id BYTEA,
        kind TEXT NOT NULL,
        intent_id BYTEA,
        "offset" BIGINT,
        length BIGINT,
        payload BYTEA NOT NULL,
        digest TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL
    )""",
    "CREATE INDEX events_intent ON events (intent_id, seq) WHERE intent_id IS NOT NULL",
    # the sequencing counter and the chain's anchor (see the module's doc)
    """CREATE TABLE chain_head (
        one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
        seq BIGINT NOT NULL,
        hash TEXT NOT NULL
    )""",
    f"INSERT INTO chain_head (seq, hash) VALUES (0, '{GENESIS}')",
    "CREATE TABLE snapshots (name TEXT PRIMARY KEY, seq BIGINT NOT NULL, state BYTEA NOT NULL)",
    """CREATE TABLE file_offsets (
        identity TEXT PRIMARY KEY,
        path TEXT NOT NULL,
        source TEXT NOT NULL,
        format TEXT NOT NULL,
        "offset" BIGINT NOT NULL,
        state TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE FUNCTION tillerman_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'the tillerman ledger is append-only: % on events refused', TG_OP;
        END $$""",
    "CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events"
    " FOR EACH ROW EXECUTE FUNCTION tillerman_append_only()",
    "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events"
    " FOR EACH STATEMENT EXECUTE FUNCTION tillerman_append_only()",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    f"INSERT INTO meta (key, value) VALUES ('chain_version', '{CHAIN_VERSION}'),"
    f" ('schema_version', '{SCHEMA_VERSION}')",
    *leases.SCHEMA,
    leases.DAEMONS,
)
#: The channel every commit that adds rows notifies, with its last seq (``ChangeListener``).
CHANNEL = "tillerman_ledger"


def _name(text: str | None) -> bytes | None:
    return None if text is None else text.encode("utf-8", "surrogatepass")


def _text(stored: bytes | None) -> str | None:
    return None if stored is None else bytes(stored).decode("utf-8", "surrogatepass")


def _stored(columns: tuple) -> tuple:
    """A row (``row_columns``) as PostgreSQL stores it."""
    return tuple(_name(v) if i in _NAMES else v for i, v in enumerate(columns))


def _snapshot(conn: psycopg.Connection, name: str) -> tuple[int, bytes] | None:
    row = conn.execute("SELECT seq, state FROM snapshots WHERE name = %s", (name,)).fetchone()
    return (row[0], bytes(row[1])) if row else None


def _loaded(row: tuple) -> tuple:
    """A stored row in the column order and types the SQLite backend reads (``entry_of``, ``verify_rows``)."""
    return tuple(_text(v) if i in _NAMES else bytes(v) if i == _PAYLOAD else v for i, v in enumerate(row))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _translate(exc: psycopg.Error, dsn: str) -> Exception:
    """The one place driver errors become the ledger's vocabulary; with every credential
    of ``dsn`` masked (``shown``), since libpq's text may quote the connection string."""
    message = shown(_first_line(exc), dsn)
    if isinstance(exc, psycopg.errors.RaiseException | psycopg.IntegrityError):
        return IntegrityError(message)
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return SchemaError(f"not a tillerman ledger (no table: {message})")
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return OperationalError(f"ledger is read-only: {message}")
    return OperationalError(f"PostgreSQL: {message}")


class PostgresRecorder(Recorder):
    def __init__(self, dsn: str, *, readonly: bool = False, create: bool = True,
                 idle_transaction_limit: float | None = None) -> None:
        """``create``: make the schema in an empty database (a reader, or ``create=False``,
        refuses a database without one instead). ``idle_transaction_limit``: seconds a
        transaction of this recorder may sit idle before the server ends it
        (``IDLE_TRANSACTION_LIMIT`` by default; a daemon gives its lease length)."""
        idle_limit = IDLE_TRANSACTION_LIMIT if idle_transaction_limit is None else idle_transaction_limit
        self.path = shown(dsn)
        self._dsn = dsn  # with its password: for the listener's and the daemon lock's own connections
        self.readonly = readonly
        self.anchor_error = None
        self._bulk: psycopg.Connection | None = None  # inside ``bulk()``: its connection, in its transaction
        self._bulk_broken = False  # the database failed inside the block: it rolls back
        self._unreachable = False  # the last statement lost its connection, or got none

        def configure(conn: psycopg.Connection) -> None:
            if readonly:
                conn.execute("SET default_transaction_read_only = on")
            else:
                conn.execute(f"SET idle_in_transaction_session_timeout = {max(1, round(idle_limit * 1000))}")

        try:  # one plain connection first: a wrong URL fails at once, not after the pool's retries
            psycopg.connect(dsn, connect_timeout=10).close()
        except psycopg.Error as exc:
            raise OperationalError(f"cannot connect to the ledger database {self.path}:"
                                   f" {shown(_first_line(exc), dsn)}") from None
        try:
            # autocommit: a read is one statement; a write is an explicit transaction()
            self._pool = psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=POOL_SIZE,
                                                     kwargs={"autocommit": True}, configure=configure,
                                                     open=False, name="tillerman-ledger")
            self._pool.open(wait=True, timeout=10)
        except psycopg_pool.PoolTimeout as exc:
            self._pool.close()
            raise OperationalError(f"cannot connect to the ledger database {self.path}: {shown(str(exc), dsn)}") from None
        try:
            self._check_schema(create=create and not readonly)
        except BaseException:
            self._pool.close()
            raise

    # -- schema -----------------------------------------------------------------

    def _check_schema(self, *, create: bool) -> None:
        with self._transaction() as conn:
            if create:  # two processes opening an empty database create it once
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SETUP_LOCK,))
            found = conn.execute("SELECT to_regclass('meta') IS NOT NULL, to_regclass('events') IS NOT NULL"
                                 ).fetchone()
            if found == (False, False):
                if not create:
                    raise SchemaError(f"no tillerman ledger in {self.path}; a writing command creates one")
                for sql in SCHEMA:
                    conn.execute(sql)
                return
            version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() \
                if found[0] else None
            if version is None:
                raise SchemaError(f"the database {self.path} holds other tables, not a tillerman ledger")
            if int(version[0]) > SCHEMA_VERSION:
                raise SchemaError(f"ledger schema version {version[0]} is newer than this tillerman understands"
                                  f" ({SCHEMA_VERSION}); upgrade tillerman")
            if create:  # a ledger made before daemons shared one (the table is created IF NOT EXISTS)
                conn.execute(leases.DAEMONS)

    # -- transactions -----------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, durable: bool = False) -> Iterator[psycopg.Connection]:
        if self._bulk is not None:
            raise ValueError("inside bulk() only appends are made, and none durable")
        with self._connection() as conn, conn.transaction():
            if durable:  # whatever the server's default: on disk before the commit returns
                conn.execute("SET LOCAL synchronous_commit = on")
            yield conn

    @contextlib.contextmanager
    def _reading(self) -> Iterator[psycopg.Connection]:
        with self._connection() as conn:
            yield conn

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection, its errors translated. A lost server (``OperationalError``:
        the connection dropped, or none to be had) makes the next waits short, until a
        statement gets through again; the pool replaces broken connections by itself."""
        wait = WAIT_WHILE_UNREACHABLE if self._unreachable else WAIT_FOR_CONNECTION
        try:
            with self._pool.connection(timeout=wait) as conn:
                yield conn
        except psycopg.Error as exc:
            raise self._failed(exc) from None
        self._unreachable = False

    def _failed(self, exc: psycopg.Error) -> Exception:
        """``exc`` in the ledger's words; whether it says the server is lost noted."""
        self._unreachable = isinstance(exc, psycopg.OperationalError)
        return _translate(exc, self._dsn)

    @contextlib.contextmanager
    def _one_moment(self) -> Iterator[psycopg.Connection]:
        """A read-only transaction whose every statement sees the same committed moment.
        Under PostgreSQL's default (read committed) each statement sees its own, so a
        writer committing between reading the head row and reading the table would show
        rows past the head: the very sign of rows written around tillerman."""
        with self._reading() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            yield conn

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        """Many appends in one transaction, which holds the head row's lock throughout
        (other writers wait until it ends). Each append is checked against the rows
        before it, the block's own included (a transaction reads what it wrote), and
        returns its entries at once. A refused append adds nothing; what was appended
        before is committed even when the block raises — unless the database itself
        failed, which rolls back the whole block."""
        if self._bulk is not None:  # nested: the outer block commits
            yield
            return
        failure: BaseException | None = None
        with self._transaction() as conn:
            before = self._locked_head(conn)[0]
            self._bulk, self._bulk_broken = conn, False
            try:
                yield
            except BaseException as exc:
                if self._bulk_broken:
                    raise
                failure = exc
            finally:
                self._bulk = None
            if (after := self._locked_head(conn)[0]) > before:
                _notify(conn, after)  # once for the block
        if failure is not None:
            raise failure

    # -- append -----------------------------------------------------------------

    def append(self, batch: Sequence[Envelope], *, durable: bool = False,
               offsets: Sequence[FileOffset] = (), fence: leases.Lease | None = None) -> AppendResult:
        """``fence``: append only while this lease is current, checked in the same
        transaction (``tillerman.ledger.leases``); ``leases.Fenced`` and nothing written
        otherwise."""
        if not batch and not offsets:
            return AppendResult()
        if self._bulk is not None and not durable:
            try:
                return self._append_on(self._bulk, batch, offsets, fence)
            except psycopg.Error as exc:
                self._bulk_broken = True
                raise self._failed(exc) from None
        with self._transaction(durable) as conn:
            return self._append_on(conn, batch, offsets, fence, notify=True)

    def _append_on(self, conn: psycopg.Connection, batch: Sequence[Envelope], offsets: Sequence[FileOffset],
                   fence: leases.Lease | None, *, notify: bool = False) -> AppendResult:
        head_seq, head_hash = self._locked_head(conn)
        if fence is not None:
            leases.check_fence(conn, fence)
        now = time.time()
        prepared = prepare(batch, head_seq, head_hash, now, lambda ids: self._known_digests(conn, ids),
                           lambda intent_id: self._intent_state(conn, intent_id))
        if offsets:
            self._save_offsets(conn, offsets, now)
        if prepared.rows:
            self._insert(conn, prepared.rows)
            last = prepared.rows[-1]
            conn.execute("UPDATE chain_head SET seq = %s, hash = %s", (last.seq, last.hash))
            if notify:
                _notify(conn, last.seq)
        return AppendResult(tuple(row.entry() for row in prepared.rows), prepared.duplicates, prepared.conflicts)

    @staticmethod
    def _insert(conn: psycopg.Connection, rows: Sequence[Row]) -> None:
        """COPY for a batch (about 1.5× ``executemany`` at 512 rows), ``executemany`` for a
        few rows (a COPY costs one more round trip before its data)."""
        with conn.cursor() as cur:
            if len(rows) < _COPY_FROM:
                cur.executemany(_INSERT, [_stored(row_columns(row)) for row in rows])
                return
            with cur.copy(_COPY) as copy:
                for row in rows:
                    copy.write_row(_stored(row_columns(row)))

    def _locked_head(self, conn: psycopg.Connection) -> tuple[int, str]:
        """Lock the head row (the writers' turn) and check that the table ends there."""
        seq, link = conn.execute("SELECT seq, hash FROM chain_head FOR UPDATE").fetchone()
        if problem := self._anchor_problem(conn, (seq, link)):
            raise AnchorMismatch(f"{problem}; nothing was written. Check it with `tillerman ledger verify`,"
                                 f" then accept the table as it is with `{ACCEPT_TAIL}`")
        return seq, link

    @staticmethod
    def _anchor_problem(conn: psycopg.Connection, head: tuple[int, str]) -> str | None:
        seq, link = head
        last = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone() or (0, GENESIS)
        if last[0] < seq:
            return (f"the ledger ends at seq {last[0]} but its head row names seq {seq}:"
                    f" {seq - last[0]} row(s) missing from the tail")
        if last[0] > seq:
            return f"the ledger runs to seq {last[0]}, past its head row's seq {seq}: rows written around tillerman"
        if last[1] != link:
            return f"seq {seq} differs from the head row"
        return None

    @staticmethod
    def _known_digests(conn: psycopg.Connection, ids: Iterable[str]) -> dict[str, str]:
        unique = list(dict.fromkeys(ids))
        if not unique:
            return {}
        rows = conn.execute("SELECT event_id, digest FROM events WHERE event_id = ANY(%s)",
                            ([_name(i) for i in unique],))
        return {_text(event_id): digest for event_id, digest in rows}

    @staticmethod
    def _intent_state(conn: psycopg.Connection, intent_id: str) -> State | None:
        row = conn.execute(
            "SELECT kind, payload FROM events WHERE intent_id = %s"
            " AND kind IN ('intent_proposed', 'intent_transition') ORDER BY seq DESC LIMIT 1",
            (_name(intent_id),),
        ).fetchone()
        if row is None:
            return None
        return State.PROPOSED if row[0] == "intent_proposed" else known_state(events.decode(row[1]).to_state, intent_id)

    @staticmethod
    def _save_offsets(conn: psycopg.Connection, offsets: Sequence[FileOffset], now: float) -> None:
        latest = {o.identity: o for o in offsets}
        with conn.cursor() as cur:
            cur.executemany(
                'INSERT INTO file_offsets (identity, path, source, format, "offset", state, updated_at)'
                " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (identity) DO UPDATE SET path = excluded.path,"
                ' source = excluded.source, format = excluded.format, "offset" = excluded."offset",'
                " state = excluded.state, updated_at = excluded.updated_at",
                [(o.identity, o.path, o.source, o.format, o.offset, o.state, o.updated_at or now)
                 for o in latest.values()],
            )

    def file_offsets(self) -> list[FileOffset]:
        with self._reading() as conn:
            rows = conn.execute(
                'SELECT identity, path, source, format, "offset", state, updated_at FROM file_offsets'
                ' ORDER BY path COLLATE "C", identity COLLATE "C"').fetchall()
        return [FileOffset(identity=i, path=p, source=s, format=f, offset=o, state=st, updated_at=u)
                for i, p, s, f, o, st, u in rows]

    # -- read -------------------------------------------------------------------

    def read(self, after_seq: int = 0, limit: int | None = None) -> Iterator[Entry]:
        """By pages of seqs: each page is a short query of its own, so a slow reader holds
        no connection (or snapshot) between them. Seqs are committed in order, so a page
        never skips one a later page would find."""
        left = limit
        while left is None or left > 0:
            page = _PAGE if left is None else min(_PAGE, left)
            with self._reading() as conn:
                rows = conn.execute(f"SELECT {COLUMNS} FROM events WHERE seq > %s ORDER BY seq LIMIT %s",
                                    (after_seq, page)).fetchall()
            for row in rows:
                yield entry_of(_loaded(row))
            if len(rows) < page:
                return
            after_seq = rows[-1][0]
            if left is not None:
                left -= len(rows)

    def max_seq(self) -> int:
        with self._reading() as conn:
            return conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]

    def intent_entries(self, intent_id: str) -> list[Entry]:
        with self._reading() as conn:
            rows = conn.execute(f"SELECT {COLUMNS} FROM events WHERE intent_id = %s ORDER BY seq",
                                (_name(intent_id),)).fetchall()
        return [entry_of(_loaded(row)) for row in rows]

    # -- snapshots --------------------------------------------------------------

    def load_snapshot(self, name: str) -> tuple[int, bytes] | None:
        with self._reading() as conn:
            return _snapshot(conn, name)

    def save_snapshot(self, name: str, seq: int, state: bytes) -> None:
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO snapshots (name, seq, state) VALUES (%s, %s, %s)"
                " ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, state = excluded.state"
                " WHERE excluded.seq >= snapshots.seq",
                (name, seq, state),
            )

    # -- verification -----------------------------------------------------------

    def verify(self) -> VerifyReport:
        """The chain walk (``tillerman.ledger.verify``) against the head row as the anchor,
        which never lags on PostgreSQL: rows past it were written around the recorder."""
        with self._one_moment() as conn:
            version = int(conn.execute("SELECT value FROM meta WHERE key = 'chain_version'").fetchone()[0])
            head = conn.execute("SELECT seq, hash FROM chain_head").fetchone()
            with conn.cursor(name="tillerman_verify") as rows:  # server-side: streamed, not all in memory
                rows.itersize = _PAGE
                rows.execute(f"SELECT {COLUMNS} FROM events ORDER BY seq")
                # The snapshot in the same moment as the rows: read on its own, a commit
                # in between showed one past the last row walked, reported as forged.
                report = verify_ledger(map(_loaded, rows), ["ok"], head, chain_version=version, had_anchor=True,
                                       snapshot=lambda name: _snapshot(conn, name), entries=self.read)
        if head[0] < report.last_seq:
            return VerifyReport(
                ok=False, rows=report.rows, last_seq=report.last_seq, chain_version=report.chain_version,
                problems=(*report.problems, f"the ledger runs to seq {report.last_seq}, past its head row's seq"
                                            f" {head[0]}: rows written around tillerman"),
                notes=tuple(n for n in report.notes if not n.startswith("head anchor lags")))
        return report

    # -- a cut tail -------------------------------------------------------------

    def tail_problem(self) -> str | None:
        """What ``append`` would refuse over, without writing (None: nothing)."""
        with self._one_moment() as conn:
            return self._anchor_problem(conn, conn.execute("SELECT seq, hash FROM chain_head").fetchone())

    def accept_tail(self, by: str) -> tuple[str, int]:
        """Accept the table as it ends: a chained ``tail_accepted`` event on its last row,
        and the head row moved onto it. Returns what was accepted and the new seq;
        ``ValueError`` when table and head row agree."""
        with self._transaction(durable=True) as conn:
            anchor = conn.execute("SELECT seq, hash FROM chain_head FOR UPDATE").fetchone()
            if (problem := self._anchor_problem(conn, anchor)) is None:
                raise ValueError("the ledger reaches its head row: there is no shorter history to accept")
            head_seq, head_hash = conn.execute(
                "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone() or (0, GENESIS)
            now = time.time()
            env = Envelope(
                event_id=f"tail_accepted:{head_seq}:{head_hash[:16]}:{now!r}", source="tillerman", at=now,
                event=TailAccepted(by=by, anchor_seq=anchor[0], anchor_hash=anchor[1], ledger_seq=head_seq),
            )
            (row,) = prepare([env], head_seq, head_hash, now, lambda ids: {}, lambda intent_id: None).rows
            conn.execute(_INSERT, _stored(row_columns(row)))
            conn.execute("UPDATE chain_head SET seq = %s, hash = %s", (row.seq, row.hash))
        return problem, row.seq

    # -- several daemons ----------------------------------------------------------

    def change_feed(self) -> ListenerFeed:
        """Every commit's NOTIFY, heard on a connection of its own (``ChangeListener``)."""
        return ListenerFeed(ChangeListener(self._dsn))

    def daemon_running(self) -> bool:
        """Whether any daemon renewed its place within its lease length (``leases.Leases.daemons``)."""
        return any(daemon["alive"] for daemon in self.leases().daemons())

    def leases(self) -> leases.Leases:
        """The thread leases of this database (``tillerman.ledger.leases``)."""
        return leases.Leases(self._transaction, self._reading)

    def close(self) -> None:
        self._pool.close()


def _notify(conn: psycopg.Connection, seq: int) -> None:
    """Delivered when the transaction commits (never for one that rolls back)."""
    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, str(seq)))


class ChangeListener:
    """Wakes a daemon when any process commits rows to the ledger (LISTEN/NOTIFY: no
    polling). Its own connection, outside the pool: it stays listening."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        try:
            self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
            self._conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            raise _translate(exc, self._dsn) from None

    def wait(self, timeout: float) -> int | None:
        """The last seq committed since the previous call, waiting up to ``timeout``
        seconds for one; None when nothing was committed meanwhile."""
        latest = None
        try:
            for note in self._conn.notifies(timeout=timeout, stop_after=1):
                latest = int(note.payload)
            for note in self._conn.notifies(timeout=0):  # what else is already here
                latest = max(latest or 0, int(note.payload))
        except psycopg.Error as exc:
            raise _translate(exc, self._dsn) from None
        return latest

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ChangeListener:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
