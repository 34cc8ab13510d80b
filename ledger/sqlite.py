"""The SQLite ledger: one file, WAL, ``BEGIN IMMEDIATE`` writes, a busy timeout.

Several processes may append at once (the daemon, ``tillerman intent propose``): each
batch takes the write lock, reads the chain head inside its transaction, and commits
contiguous seqs. The head (last seq and hash) is also anchored in a file beside the
database (``LEDGER.head``), so a tail cut off the table shows:

* the anchor is created, anchoring the empty chain, before a ledger's first commit,
  and ``meta.anchored`` records that it exists: from then on a missing anchor is damage;
* every append first checks the table against the anchor and refuses to write on top
  of a table that ends before it (``AnchorMismatch``) until a person accepts the
  shorter history (``accept_tail``, a chained ``tail_accepted`` event);
* after each commit the anchor moves to the new head. When that write fails (a full
  disk) the rows stay committed, ``anchor_error`` says so, and the next write catches
  the anchor up;
* inside ``one_anchor()`` (a daemon round: several commits in a few milliseconds) it
  moves once, when the block ends, to the last head this connection committed, on a
  thread of its own (``close`` waits for it).

A reader (``readonly=True``) never writes: no migration, no anchor, no snapshot.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path

from tillerman.ledger import events, segments
from tillerman.ledger.batch import Prepared, Row, entry_of, none_stored, prepare, row_columns
from tillerman.ledger.errors import (
    AnchorMismatch,
    IllegalTransition,
    IntegrityError,
    LedgerError,
    OperationalError,
    SchemaError,
)
from tillerman.ledger.event_keys import event_key
from tillerman.ledger.events import Entry, Envelope, LedgerArchived, TailAccepted
from tillerman.ledger.file_offsets import FileOffset
from tillerman.ledger.intent_states import State, known_state
from tillerman.ledger.changes import WalWatcher
from tillerman.ledger.load import LedgerLoad
from tillerman.ledger.lock import LedgerLock
from tillerman.ledger.migrations import EVENT_COLUMNS, KEY_INDEX, SCHEMA_VERSION, index_the_keys, migrate
from tillerman.ledger.paths import ledger_files
from tillerman.ledger.recorder import (
    CHAIN_VERSION,
    GENESIS,
    AppendResult,
    Recorder,
    VerifyReport,
)
from tillerman.ledger.verify import verify_ledger
from tillerman.ledger.wal_checkpoints import BackgroundCheckpoints

BUSY_TIMEOUT_MS = 10_000
#: A new ledger's page size. A row is about a kilobyte (its payload and three hex digests):
#: with SQLite's default 4 KiB pages, a bulk load spent a fifth more CPU per row (more
#: pages to fill, write to the WAL and check point). Existing files keep theirs.
PAGE_SIZE = 16384
#: The page cache of a connection that loads many rows (a ``bulk()`` block of LOAD_ROWS or
#: more: a replay), in KiB. Event ids are random, so each insert touches a random page of
#: the index of their keys; past SQLite's default 2 MiB most of those were read back from
#: the file (at 470k rows, 30 µs of CPU per appended row; 20-23 µs with this cache). A
#: daemon's rounds are smaller and keep the default.
LOAD_CACHE_KIB = 32768
LOAD_ROWS = 4096
SORT_CACHE_KIB = 2048  # SQLite's default cache: the runs an index build sorts in memory
AUTOCHECKPOINT_PAGES = 1000  # SQLite's default: a commit past this many log pages checkpoints
_IN_CHUNK = 500  # bound on `IN (...)` parameters per query

ACCEPT_TAIL = "tillerman ledger accept-tail --by NAME"
COLUMNS = EVENT_COLUMNS

_INSERT = f"INSERT INTO events ({COLUMNS}, id_key) VALUES ({', '.join('?' * 16)})"
_SEQ, _PREV_HASH, _HASH = 0, 13, 14  # where ``row_columns`` puts them


def _key_the_unkeyed(db: sqlite3.Connection) -> None:
    """A row stored without a key (``tillerman.ledger.event_keys``) whose key no row holds
    any more (the row that held it was archived) takes it: an append that meets its id
    finds it by the key again, as ``_insert`` expects of every key not held."""
    for seq, event_id in db.execute(
            "SELECT seq, event_id FROM events INDEXED BY events_unkeyed WHERE id_key IS NULL").fetchall():
        key = event_key(event_id)
        if db.execute("SELECT 1 FROM events WHERE id_key = ?", (key,)).fetchone() is None:
            db.execute("UPDATE events SET id_key = ? WHERE seq = ?", (key, seq))


def _translate(exc: sqlite3.Error) -> Exception:
    """The one place driver errors become the ledger's vocabulary."""
    message = str(exc)
    if isinstance(exc, sqlite3.IntegrityError):
        return IntegrityError(message)
    if isinstance(exc, sqlite3.OperationalError):
        if "locked" in message or "busy" in message:
            return OperationalError(f"ledger is busy (another writer holds it): {message}")
        if "readonly" in message:
            return OperationalError(f"ledger is read-only: {message}")
        if "full" in message:
            return OperationalError(f"ledger disk is full: {message}")
        return OperationalError(message)
    if isinstance(exc, sqlite3.DatabaseError) and "malformed" in message:
        return IntegrityError(f"the ledger is damaged ({message}); `tillerman ledger verify` names the last"
                              " good seq")
    if isinstance(exc, sqlite3.DatabaseError):
        return SchemaError(f"not a readable tillerman ledger: {message}")
    return OperationalError(message)


class SQLiteRecorder(Recorder):
    def __init__(self, path: str | Path = ":memory:", *, busy_timeout_ms: int = BUSY_TIMEOUT_MS,
                 readonly: bool = False) -> None:
        # The real path from here on: a reader of the WAL's change events sees absolute
        # paths, a later chdir must not move the ledger, and a symlink to it must name
        # the same anchor and lock files (``tillerman.ledger.paths``).
        self.memory = str(path) == ":memory:"
        self.files = None if self.memory else ledger_files(path)
        self.path = str(path) if self.files is None else self.files.path
        self.head_path = None if self.files is None else Path(self.files.head)
        self.readonly = readonly and not self.memory
        #: Why the last anchor write failed (its rows are committed); None once one succeeds.
        self.anchor_error: str | None = None
        #: A reader's finding that the file itself is cut (then it reads the whole pages left).
        self.damage: str | None = None
        self._bulk: _Bulk | None = None  # inside ``bulk()``: the head it reached
        # Whether the next append is prepared as if none of its ids were stored (``_store``):
        # true until an append meets a stored id, and again after one that met none.
        self._expect_new = True
        # Inside ``one_anchor()``: the head committed last, or (0, GENESIS) while none.
        self._unanchored: tuple[int, str] | None = None
        self._anchor_seen: tuple[tuple[int, ...], tuple[int, str]] | None = None  # see _read_anchor
        self._mover = _AnchorMover(self._write_anchor)  # one_anchor()'s moves
        self._checkpoints: BackgroundCheckpoints | None = None  # ``checkpoint_in_background``
        try:
            if self.readonly:
                self._db, self.damage = _connect_readonly(self.path)
            else:
                if not self.memory:
                    _create_private(Path(self.path))
                self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if self.readonly:
                _check_readable(self._db, version)
            else:
                if not self.memory:
                    if version == 0:  # a new file: the page size is set before its first page
                        self._db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                    self._db.execute("PRAGMA journal_mode = WAL")
                self._db.execute("PRAGMA synchronous = NORMAL")
                # Savepoints (``_store``) journal each page they change before changing it:
                # in a temporary file that was 1.1 GB of writes for a 120 MB replay, and a
                # write per daemon round. In memory it is at most one batch's pages.
                self._db.execute("PRAGMA temp_store = MEMORY")
                if version != SCHEMA_VERSION:
                    with self._transaction():  # only a migration needs the write lock to open
                        migrate(self._db)
                        if self.head_path is not None and self.head_path.exists():
                            self._mark_anchored(self._db)  # a ledger from before meta.anchored
                elif not self._keys_indexed():  # a load stopped before it built the index
                    self._index_keys()
                if _meta(self._db, segments.SEGMENT_META) is not None:
                    self._db.close()
                    raise SchemaError(f"{self.path} is an archive segment, history that is never written to;"
                                      " give --ledger the live ledger file it was archived from")
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    # -- transactions -----------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, durable: bool = False) -> Iterator[sqlite3.Connection]:
        if self._bulk is not None:
            raise ValueError("inside bulk() only appends are made, and none durable")
        db = self._db
        try:
            if durable:
                db.execute("PRAGMA synchronous = FULL")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            if self._checkpoints is not None:
                self._checkpoints.committed()
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise _translate(exc) from exc
        finally:
            if durable:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("PRAGMA synchronous = NORMAL")

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        """Many appends in one transaction: one commit and one anchor move for all of
        them instead of one each (a replay appends one event at a time). This
        connection holds the write lock throughout, so each append is prepared on the
        rows before it (stored, or earlier in the block), inserted, and returns its
        entries at once. A refused append (``IllegalTransition``) adds nothing, and what was
        appended before is committed even when the block raises — unless the ledger
        itself failed (the disk), which rolls back the whole block. Other writers wait
        until it ends (the busy timeout)."""
        if self._bulk is not None:  # nested: the outer block commits
            yield
            return
        failure: BaseException | None = None
        with self._transaction() as db:
            anchor = self._check_anchor(db)
            bulk = self._bulk = _Bulk(self._head(db))
            first_seq = bulk.head[0]
            try:
                yield
            except BaseException as exc:
                if bulk.broken:
                    raise  # the transaction rolls back
                failure = exc
            finally:
                self._bulk = None
        self._move_anchor(anchor, *bulk.head)
        if bulk.head[0] - first_seq >= LOAD_ROWS:
            self._db.execute(f"PRAGMA cache_size = -{LOAD_CACHE_KIB}")  # from the next block on
        if failure is not None:
            raise failure

    @contextlib.contextmanager
    def keys_indexed_last(self) -> Iterator[None]:
        """For a load into a ledger with no rows (``tillerman.ledger.load``): the index of
        the ids' keys dropped while the rows go in and built over them when the block
        ends. Inserted one by one, each row's key lands on a random page of that index,
        and every commit wrote those pages to the log again: 1M rollout lines wrote 1.19 GB
        for a 403 MB ledger, 0.82 GB with the index built last (a sort), and took about 5%
        less time. A load that stops before the end leaves the index unbuilt; whoever opens
        the ledger next builds it (``__init__``). A ledger with rows keeps its index."""
        if self.max_seq():
            yield
            return
        with self._transaction() as db:
            db.execute(f"DROP INDEX IF EXISTS {KEY_INDEX}")
        try:
            yield
        except BaseException:
            with contextlib.suppress(LedgerError):
                self._index_keys()  # or the next to open it will: the load's own failure is the one to raise
            raise
        self._index_keys()

    def _keys_indexed(self) -> bool:
        return bool(self._query("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (KEY_INDEX,)))

    def _index_keys(self) -> None:
        """Build the key index in flat memory: SQLite sorts the keys in runs of at most
        the page cache, spilled to a temporary file on disk (a load's 32 MiB cache and
        memory for temporary files would hold every key: at 470k rows the writer's peak
        grew by 19 MiB)."""
        db = self._db
        cache = db.execute("PRAGMA cache_size").fetchone()[0]
        db.execute("PRAGMA temp_store = FILE")
        db.execute(f"PRAGMA cache_size = -{SORT_CACHE_KIB}")
        try:
            with self._transaction() as db:
                index_the_keys(db)
        finally:
            db.execute(f"PRAGMA cache_size = {cache}")
            db.execute("PRAGMA temp_store = MEMORY")

    @contextlib.contextmanager
    def load(self) -> Iterator[Recorder]:
        """Into a ledger file with no rows, a recorder whose appends are prepared in this
        process and written by another (``tillerman.ledger.load``), for a caller that
        appends only new events and what it records itself, as a replay of files each
        named once does; this recorder itself otherwise. The load's rows are committed
        when the block ends, what it raises included."""
        if self.memory or self.readonly or self._bulk is not None or self.max_seq():
            yield self
            return
        loading = LedgerLoad(self.path)
        try:
            yield loading
        finally:
            loading.close()

    @contextlib.contextmanager
    def one_anchor(self) -> Iterator[None]:
        """Commits inside the block move the head anchor once, when it ends, instead of
        once each: the move is a rename over the old file, which ext4 follows with a
        flush of the new one (about 1.5 ms, most of a small append).

        Until the block ends the anchor lags behind the rows the block committed, as
        after a crash between a commit and its anchor move (``verify`` notes the lag;
        it is not damage). A cut of those rows made meanwhile is still caught: the
        anchor written at the end names the head this connection committed, not what
        the table holds then, and the next append refuses a table that ends before it.
        Only a crash inside the block leaves its rows unanchored. The anchor is moved
        even when the block raises: its commits stand.

        The move is made on a thread of its own (``_AnchorMover``), so the caller goes
        on while the file system flushes; the lag grows by that flush (its failure is
        in ``anchor_error`` once known), and ``close`` waits for it."""
        if self._unanchored is not None or self.head_path is None:  # nested, or no anchor
            yield
            return
        self._unanchored = (0, GENESIS)
        try:
            yield
        finally:
            head, self._unanchored = self._unanchored, None
            if head[0]:
                self._mover.move(head)

    # -- append -----------------------------------------------------------------

    def append(self, batch: Sequence[Envelope], *, durable: bool = False,
               offsets: Sequence[FileOffset] = ()) -> AppendResult:
        """``offsets``: file tailer positions, written in the same transaction as the
        events read from those spans (the last one per identity wins)."""
        if not batch and not offsets:
            return AppendResult()
        if self._bulk is not None and not durable:
            return self._append_in_bulk(batch, offsets)
        with self._transaction(durable) as db:
            anchor = self._check_anchor(db)
            if offsets:
                self._save_offsets(db, offsets, time.time())
            head_seq, head_hash = self._head(db)
            prepared = self._store(db, batch, head_seq, head_hash)
        if prepared.rows:
            head_seq, head_hash = prepared.rows[-1].seq, prepared.rows[-1].hash
        self._move_anchor(anchor, head_seq, head_hash)
        return _result(prepared)

    def append_unseen(self, batch: Sequence[Envelope]) -> AppendResult:
        """``append`` of events the caller knows no row holds (their ids were never
        appended: a replay's observations of a file it reads once into this ledger).
        Inside ``bulk()`` they are inserted as prepared, with no savepoint: the savepoint
        that lets ``append`` take back a batch meeting a stored id journals every page the
        batch changes (a 16 KiB index page per random id: at 300k lines, 1.1 GB written
        for a 120 MB ledger). A stored id met anyway breaks the block, which rolls back."""
        if self._bulk is None:
            return self.append(batch)
        return self._append_in_bulk(batch, (), unseen=True) if batch else AppendResult()

    def _append_in_bulk(self, batch: Sequence[Envelope], offsets: Sequence[FileOffset], *,
                        unseen: bool = False) -> AppendResult:
        bulk, db = self._bulk, self._db
        assert bulk is not None
        try:
            if unseen:
                prepared = prepare(batch, *bulk.head, time.time(), none_stored,
                                   lambda intent_id: self._intent_state(db, intent_id))
                self._insert(db, prepared.rows)
            else:
                prepared = self._store(db, batch, *bulk.head)
            if offsets:
                self._save_offsets(db, offsets, time.time())
        except sqlite3.Error as exc:
            bulk.broken = True
            raise _translate(exc) from exc
        if prepared.rows:
            bulk.head = (prepared.rows[-1].seq, prepared.rows[-1].hash)
        return _result(prepared)

    def _store(self, db: sqlite3.Connection, batch: Sequence[Envelope], head_seq: int, head_hash: str) -> Prepared:
        """Prepare ``batch`` on the head and insert its rows, inside the open transaction.

        Looking each id up before the insert cost about as much as the insert itself, and
        finds nothing in the common case (new events: a replay, a file read on). So while
        appends meet no stored id, a batch is prepared as if none were stored and inserted
        under a savepoint: the unique index on the ids' keys refuses a stored one, and
        then the savepoint is rolled back and the batch prepared again on the stored
        digests (duplicates dropped, conflicts recorded), exactly as if looked up first.
        So is a batch whose intent event was refused: it may be a stored one offered again
        (a duplicate), which only the lookup tells from an illegal move. Ids repeated
        within the batch are ``prepare``'s own to drop either way."""
        def stored_state(intent_id: str) -> State | None:
            return self._intent_state(db, intent_id)

        observed = time.time()
        # The index refuses a stored id only where it exists: a load into this ledger while it
        # was empty builds it last (``keys_indexed_last``), and meanwhile every id is looked up.
        if self._expect_new and self._keys_indexed():
            try:
                prepared = prepare(batch, head_seq, head_hash, observed, none_stored, stored_state)
            except IllegalTransition:  # maybe an intent event offered again: stored, a duplicate
                self._expect_new = False
            else:
                db.execute("SAVEPOINT expect_new")
                try:
                    self._insert(db, prepared.rows)
                except sqlite3.IntegrityError:
                    db.execute("ROLLBACK TO expect_new")
                    self._expect_new = False
                else:
                    return prepared
                finally:
                    db.execute("RELEASE expect_new")
        prepared = prepare(batch, head_seq, head_hash, observed, lambda ids: self._known_digests(db, ids),
                           stored_state)
        self._insert(db, prepared.rows)
        self._expect_new = not prepared.duplicates and not prepared.conflicts
        return prepared

    @staticmethod
    def _insert(db: sqlite3.Connection, rows: Sequence[Row]) -> None:
        SQLiteRecorder._insert_columns(db, [row_columns(row) for row in rows])

    @staticmethod
    def _insert_columns(db: sqlite3.Connection, columns: Sequence[tuple]) -> None:
        """Insert rows given in the stored column order (``row_columns``), each under its
        id's key (``tillerman.ledger.event_keys``). A key another id holds already goes
        unkeyed for this row (the rows before it stay in, the rest follow); a stored id
        raises ``IntegrityError`` as the text's own index did, for the caller to handle."""
        params = [(*row, event_key(row[1])) for row in columns]
        start = 0
        while start < len(params):
            before = db.total_changes
            try:
                db.executemany(_INSERT, params[start:] if start else params)
                return
            except sqlite3.IntegrityError:
                failed = start + db.total_changes - before
                event_id, key = params[failed][1], params[failed][-1]
                holder = None if key is None else db.execute(
                    "SELECT event_id FROM events WHERE id_key = ?", (key,)).fetchone()
                if holder is None or holder[0] == event_id:
                    raise  # the id is stored (or the row breaks another constraint)
                params[failed] = (*params[failed][:-1], None)
                start = failed

    def insert_prepared(self, columns: Sequence[tuple]) -> None:
        """Inside ``bulk()``: rows another process prepared on this ledger's head, in the
        stored column order (``row_columns``), inserted as they are (a load:
        ``tillerman.ledger.load``). Rows that do not chain to the head, because another
        writer appended meanwhile, are refused and nothing of them is written."""
        bulk = self._bulk
        if bulk is None:
            raise ValueError("insert_prepared() is for inside bulk()")
        if not columns:
            return
        first, last = columns[0], columns[-1]
        if (first[_SEQ], first[_PREV_HASH]) != (bulk.head[0] + 1, bulk.head[1]):
            raise OperationalError(f"the ledger's head is seq {bulk.head[0]} where the rows loaded into it chain to"
                                   f" seq {first[_SEQ] - 1}: another writer appended meanwhile")
        try:
            self._insert_columns(self._db, columns)
        except sqlite3.Error as exc:
            bulk.broken = True
            raise _translate(exc) from exc
        bulk.head = (last[_SEQ], last[_HASH])

    def _move_anchor(self, anchor: tuple[int, str] | None, head_seq: int, head_hash: str) -> None:
        if self._unanchored is not None:  # inside one_anchor(): moved when the block ends
            if head_seq > self._unanchored[0]:
                self._unanchored = (head_seq, head_hash)
            return
        if self.head_path is not None and head_seq and (anchor is None or anchor[0] < head_seq):
            # also catches up an anchor a full disk or a crash left behind
            self._write_anchor(head_seq, head_hash)

    def _check_anchor(self, db: sqlite3.Connection) -> tuple[int, str] | None:
        """Inside the write transaction, before anything is written: the table must
        reach its anchor. The first write of a ledger creates the anchor (on the empty
        chain's head) before its commit, so a ledger with rows always has one."""
        if self.head_path is None:
            return None
        anchor = self._read_anchor()
        if problem := self._anchor_problem(db, anchor):
            raise AnchorMismatch(f"{problem}; nothing was written. Check it with `tillerman ledger verify`,"
                                 f" then accept the table as it is with `{ACCEPT_TAIL}`")
        if anchor is None:
            if not self._write_anchor(*self._head(db)):
                raise OperationalError(f"cannot create the head anchor: {self.anchor_error}")
            self._mark_anchored(db)
            anchor = self._read_anchor()
        return anchor

    def _anchor_problem(self, db: sqlite3.Connection, anchor: tuple[int, str] | None) -> str | None:
        """What is wrong between the table and its anchor; None when the table reaches
        it (a lagging anchor is not wrong: a crash or a full disk after a commit)."""
        if anchor is None:
            return f"the head anchor {self.head_path} is missing, but this ledger had one" \
                if _meta(db, "anchored") else None
        seq, link = anchor
        if seq < 0:
            return f"the head anchor {self.head_path} is unreadable"
        head_seq, _ = self._head(db)
        if seq > head_seq:
            return (f"the ledger ends at seq {head_seq} but its head anchor names seq {seq}:"
                    f" {seq - head_seq} row(s) missing from the tail")
        row = db.execute("SELECT hash FROM events WHERE seq = ?", (seq,)).fetchone()
        if seq and (row is None or row[0] != link):
            return f"seq {seq} differs from the head anchor"
        return None

    @staticmethod
    def _mark_anchored(db: sqlite3.Connection) -> None:
        db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('anchored', '1')")

    def tail_problem(self) -> str | None:
        """What ``append`` would refuse over, without writing (None: nothing)."""
        if self.head_path is None:
            return None
        try:
            return self._anchor_problem(self._db, self._read_anchor())
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    def accept_tail(self, by: str) -> tuple[str, int]:
        """Accept the table as it is although it ends before its anchor (or the anchor
        is gone): record who did, in a chained ``tail_accepted`` event, and move the
        anchor onto it. Returns what was accepted and the new seq; raises
        ``ValueError`` when table and anchor agree."""
        with self._transaction(durable=True) as db:
            anchor = self._read_anchor()
            problem = self._anchor_problem(db, anchor)
            if problem is None:
                raise ValueError("the ledger reaches its head anchor: there is no shorter history to accept")
            head_seq, head_hash = self._head(db)
            now = time.time()
            env = Envelope(
                event_id=f"tail_accepted:{head_seq}:{head_hash[:16]}:{now!r}", source="tillerman", at=now,
                event=TailAccepted(by=by, anchor_seq=anchor[0] if anchor else None,
                                   anchor_hash=anchor[1] if anchor else None, ledger_seq=head_seq),
            )
            (row,) = prepare([env], head_seq, head_hash, now, lambda ids: {}, lambda intent_id: None).rows
            self._insert(db, [row])
            self._mark_anchored(db)
        if not self._write_anchor(row.seq, row.hash, force=True):
            raise OperationalError(f"accepted at seq {row.seq}, but {self.anchor_error};"
                                   " run the command again once the disk has room")
        return problem, row.seq

    @staticmethod
    def _save_offsets(db: sqlite3.Connection, offsets: Sequence[FileOffset], now: float) -> None:
        latest = {o.identity: o for o in offsets}
        db.executemany(
            "INSERT INTO file_offsets (identity, path, source, format, offset, state, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (identity) DO UPDATE SET path = excluded.path,"
            " source = excluded.source, format = excluded.format, offset = excluded.offset,"
            " state = excluded.state, updated_at = excluded.updated_at",
            [(o.identity, o.path, o.source, o.format, o.offset, o.state, o.updated_at or now)
             for o in latest.values()],
        )

    def file_offsets(self) -> list[FileOffset]:
        """Every followed file generation and where it was read up to."""
        try:
            rows = self._db.execute(
                "SELECT identity, path, source, format, offset, state, updated_at FROM file_offsets"
                " ORDER BY path, identity").fetchall()
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        return [FileOffset(identity=i, path=p, source=s, format=f, offset=o, state=st, updated_at=u)
                for i, p, s, f, o, st, u in rows]

    def _head(self, db: sqlite3.Connection) -> tuple[int, str]:
        row = db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        return (row[0], row[1]) if row else (0, GENESIS)

    def _known_digests(self, db: sqlite3.Connection, ids: Iterable[str]) -> dict[str, str]:
        """The stored digest of each of ``ids`` that is stored: found by key, where the
        holder of a key may be another id (``tillerman.ledger.event_keys``), and among the
        unkeyed rows by the id itself."""
        found: dict[str, str] = {}
        wanted = dict.fromkeys(ids)
        unique = list(wanted)
        for chunk in _chunks([event_key(event_id) for event_id in unique]):
            marks = ", ".join("?" * len(chunk))
            found.update((event_id, digest) for event_id, digest in db.execute(
                f"SELECT event_id, digest FROM events WHERE id_key IN ({marks})", chunk) if event_id in wanted)
        for chunk in _chunks(unique):
            marks = ", ".join("?" * len(chunk))
            found.update(db.execute(
                f"SELECT event_id, digest FROM events INDEXED BY events_unkeyed WHERE id_key IS NULL"
                f" AND event_id IN ({marks})", chunk))
        return found

    def _intent_state(self, db: sqlite3.Connection, intent_id: str) -> State | None:
        row = db.execute(
            "SELECT kind, payload FROM events WHERE intent_id = ?"
            " AND kind IN ('intent_proposed', 'intent_transition') ORDER BY seq DESC LIMIT 1",
            (intent_id,),
        ).fetchone()
        if row is None:
            return None
        return State.PROPOSED if row[0] == "intent_proposed" else known_state(events.decode(row[1]).to_state, intent_id)

    # -- read -------------------------------------------------------------------

    def read(self, after_seq: int = 0, limit: int | None = None) -> Iterator[Entry]:
        sql = f"SELECT {COLUMNS} FROM events WHERE seq > ? ORDER BY seq"
        params: tuple = (after_seq,)
        if limit is not None:
            sql += " LIMIT ?"
            params += (limit,)
        try:
            cursor = self._db.execute(sql, params)
            while chunk := cursor.fetchmany(1000):
                for row in chunk:
                    yield entry_of(row)
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    def rows(self, after_seq: int = 0, kinds: Collection[str] | None = None) -> Iterator[tuple]:
        """Stored rows (``COLUMNS``) with ``seq > after_seq`` in order, undecoded; only
        those of ``kinds`` when given (the kind index finds them)."""
        sql = f"SELECT {COLUMNS} FROM events WHERE seq > ?"
        params: tuple = (after_seq,)
        if kinds is not None:
            sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params += tuple(kinds)
        try:
            cursor = self._db.execute(sql + " ORDER BY seq", params)
            while chunk := cursor.fetchmany(1000):
                yield from chunk
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    def history(self, after_seq: int = 0, kinds: Collection[str] | None = None) -> Iterator[Entry]:
        """The live rows and those ``ledger archive`` moved into segments, in seq order
        (``tillerman.ledger.segments.merged_history``)."""
        return segments.merged_history(self, after_seq, kinds)

    def open_segment(self, seq: int, marker: LedgerArchived) -> SQLiteRecorder:
        """The archive segment ``marker`` (recorded at ``seq``) names, read-only;
        ``IntegrityError`` when it is not there or is no segment."""
        path = segments.segment_dir(self.path) / marker.segment
        if not path.is_file():
            raise IntegrityError(f"the archive segment {path} (named at seq {seq}: {segments.describe(marker)})"
                                 " is missing; restore it from a backup")
        segment = SQLiteRecorder(path, readonly=True)
        if segment.segment_header() is None:
            segment.close()
            raise IntegrityError(f"{path} (named at seq {seq}) is not an archive segment; restore it from a backup")
        return segment

    def segment_header(self) -> str | None:
        """What an archive segment says of itself (``tillerman.ledger.segments``); None
        for a ledger (or a file too damaged to say)."""
        try:
            return _meta(self._db, segments.SEGMENT_META)
        except sqlite3.DatabaseError:
            return None

    def archive_commit(self, moved: Sequence[int], marker: LedgerArchived, *, planned_through: int,
                       threads: Collection[str], intents: Collection[str], at: float,
                       checkpoint: Callable[[str], None] = lambda point: None) -> int:
        """Record ``marker`` and delete the ``moved`` rows (already in its segment), in one
        durable transaction; the saved fold goes too (it covers rows no longer here: the
        next reader folds the live rows afresh). Refused, with nothing changed, when a row
        written after the plan (seq > ``planned_through``) belongs to a thread or intent
        that moves, or when a moved row is gone. Returns the marker's seq."""
        with self._transaction(durable=True) as db:
            self._check_anchor(db)
            for thread_id, intent_id in db.execute("SELECT thread_id, intent_id FROM events WHERE seq > ?",
                                                   (planned_through,)):
                if thread_id in threads or intent_id in intents:
                    raise OperationalError(f"thread {thread_id} or intent {intent_id} was written to while"
                                           " archiving; nothing was moved: run the archive again")
            present = sum(db.execute(f"SELECT count(*) FROM events WHERE seq IN ({', '.join('?' * len(chunk))})",
                                     chunk).fetchone()[0] for chunk in _chunks(moved))
            if present != len(moved):
                raise IntegrityError(f"{len(moved) - present} of the rows to archive are no longer in the ledger;"
                                     " nothing was moved")
            head_seq, head_hash = self._head(db)
            env = Envelope(event_id=f"ledger_archived:{marker.segment}", source="tillerman", at=at, event=marker)
            (row,) = prepare([env], head_seq, head_hash, at, lambda ids: {}, lambda intent_id: None).rows
            self._insert(db, [row])
            for chunk in _chunks(moved):
                db.execute(f"DELETE FROM events WHERE seq IN ({', '.join('?' * len(chunk))})", chunk)
            _key_the_unkeyed(db)
            db.execute("DELETE FROM snapshots")
        checkpoint("rows_moved")
        if self.head_path is not None:
            self._write_anchor(row.seq, row.hash)
        return row.seq

    def free_pages(self) -> int:
        """Pages the file holds but no row uses (what ``vacuum`` gives back)."""
        return self._query("PRAGMA freelist_count")[0][0]

    def vacuum(self) -> None:
        """Rewrite the file without its free pages, and empty the WAL into it, so the
        file on disk shrinks."""
        try:
            self._db.execute("VACUUM")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    def max_seq(self) -> int:
        return self._query("SELECT max(seq) FROM events")[0][0] or 0

    def data_version(self) -> int:
        """Changes when another connection commits: a cheap "anything new?" probe."""
        return self._query("PRAGMA data_version")[0][0]

    def intent_entries(self, intent_id: str) -> list[Entry]:
        rows = self._query(f"SELECT {COLUMNS} FROM events WHERE intent_id = ? ORDER BY seq", (intent_id,))
        return [entry_of(r) for r in rows]

    # -- snapshots --------------------------------------------------------------

    def load_snapshot(self, name: str) -> tuple[int, bytes] | None:
        rows = self._query("SELECT seq, state FROM snapshots WHERE name = ?", (name,))
        return (rows[0][0], bytes(rows[0][1])) if rows else None

    def save_snapshot(self, name: str, seq: int, state: bytes) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT INTO snapshots (name, seq, state) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, state = excluded.state"
                " WHERE excluded.seq >= snapshots.seq",
                (name, seq, state),
            )

    # -- verification -----------------------------------------------------------

    def verify(self) -> VerifyReport:
        """The chain walk, through the archive segments this ledger names (rows moved
        out by ``ledger archive`` are checked where they are now)."""
        if (header := self.segment_header()) is not None:
            return segments.verify_alone(self, header)

        unreadable: list[str] = []
        # The anchor first: it names a committed row, so read before the rows it never
        # names one they lack.
        anchor = self._read_anchor() if self.head_path else None

        def rows() -> Iterator[tuple]:
            try:
                # row by row: a bad page must not take the good rows before it along
                yield from self._db.execute(f"SELECT {COLUMNS} FROM events ORDER BY rowid")
            except sqlite3.DatabaseError as exc:  # a truncated or overwritten page: stop there
                unreadable.append(str(exc))

        with self._one_moment():
            try:
                integrity = [r[0] for r in self._db.execute("PRAGMA integrity_check")]
            except sqlite3.DatabaseError as exc:
                integrity = [str(exc)]
            if self.damage:
                unreadable.append(self.damage)
            try:
                version = int(_meta(self._db, "chain_version") or CHAIN_VERSION)
                had_anchor = _meta(self._db, "anchored") is not None
            except sqlite3.DatabaseError as exc:
                version, had_anchor = CHAIN_VERSION, False
                unreadable.append(str(exc))
            with segments.ChainThrough(self, rows()) as chain:
                report = verify_ledger(chain.rows, integrity, anchor, chain_version=version, had_anchor=had_anchor,
                                       unreadable=unreadable, snapshot=self._verifiable_snapshot, entries=self.read)
                return chain.complete(report)

    @contextlib.contextmanager
    def _one_moment(self) -> Iterator[None]:
        """One read transaction: every statement in it sees the ledger as it was at its
        first (WAL keeps that moment for it). Statement by statement, a daemon's commit
        between the walk and the fold snapshot's read showed a snapshot past the last
        row walked, reported as forged."""
        if self._db.in_transaction:
            yield
            return
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            if self._db.in_transaction:  # an error may have ended it already
                self._db.execute("ROLLBACK")  # it read only

    def _verifiable_snapshot(self, name: str) -> tuple[int, bytes] | None:
        try:
            return self.load_snapshot(name)
        except (IntegrityError, OperationalError):
            return None

    # -- the head anchor --------------------------------------------------------

    def _read_anchor(self) -> tuple[int, str] | None:
        """The anchor file's seq and hash; None when there is none. The file is read only
        when it is not the one this connection last read or wrote (its inode, size and
        times tell): every append checks it, and reading and parsing it cost more than
        the append's own queries. A file edited in place or replaced has other times or
        another inode, so any change is read (on a kernel whose file times are coarse,
        not one that keeps the size within the same clock tick as this connection's own
        write: the next change, or any other connection, still reads it)."""
        if self.head_path is None:
            return None
        try:
            if self._anchor_seen is not None and self._anchor_seen[0] == _file_key(os.stat(self.head_path)):
                return self._anchor_seen[1]
            with open(self.head_path, "rb") as fh:
                key, text = _file_key(os.fstat(fh.fileno())), fh.read()
        except FileNotFoundError:
            return None
        except OSError:
            return (-1, "unreadable")
        try:
            data = json.loads(text)
            anchor = int(data["seq"]), str(data["hash"])
        except (ValueError, KeyError, TypeError):
            return (-1, "unreadable")
        self._anchor_seen = (key, anchor)
        return anchor

    def _write_anchor(self, seq: int, link: str, *, force: bool = False) -> bool:
        """Move the head file to ``seq`` unless another writer already anchored a later
        one (``force``: move it back, for ``accept_tail``). False, with ``anchor_error``
        set and no temporary file left, when the file system refuses."""
        assert self.head_path is not None
        assert self.files is not None
        tmp = Path(self.files.head_temporary(os.getpid()))
        try:
            # Writers serialize on a lock file of their own. Never a descriptor of the database
            # file: closing one drops every POSIX lock this process holds on it, SQLite's
            # included, and other connections then stop seeing this writer's commits.
            fd = os.open(self.files.head_lock, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                current = self._read_anchor()
                if not force and current is not None and current[0] >= seq:
                    return True
                tmp_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(tmp_fd, "w") as fh:
                    fh.write(json.dumps({"seq": seq, "hash": link, "schema": SCHEMA_VERSION}))
                os.replace(tmp, self.head_path)
                # still under the lock: no other writer replaced it since
                self._anchor_seen = (_file_key(os.stat(self.head_path)), (seq, link))
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.anchor_error = f"the head anchor {self.head_path} was not moved to seq {seq} ({exc.strerror or exc})"
            return False
        self.anchor_error = None
        return True

    def change_feed(self) -> WalWatcher | None:
        """The writes to this ledger's ``-wal`` file (``tillerman.ledger.changes``)."""
        return None if self.memory else WalWatcher(self.path)

    def daemon_running(self) -> bool:
        """Whether a daemon holds this ledger's lock file (``tillerman.ledger.lock``)."""
        return not self.memory and LedgerLock(self.path).held()

    def checkpoint_in_background(self) -> BackgroundCheckpoints | None:
        """Copy the log into the database on a thread of its own from now on, never in a
        commit of this connection (``tillerman.ledger.wal_checkpoints``): for the daemon,
        whose commits its actions wait for. None for a ledger in memory or read only."""
        if self._checkpoints is None and not (self.memory or self.readonly):
            self._db.execute("PRAGMA wal_autocheckpoint = 0")
            self._checkpoints = BackgroundCheckpoints(self.path)
        return self._checkpoints

    def checkpoint_in_commits(self) -> None:
        """Stop the thread ``checkpoint_in_background`` started, if one runs, after the
        checkpoint under way: this connection's commits checkpoint again, as SQLite's
        do by default (replay stops it before it forks the next file's reader)."""
        if self._checkpoints is not None:
            self._checkpoints.stop()
            self._checkpoints = None
            self._db.execute(f"PRAGMA wal_autocheckpoint = {AUTOCHECKPOINT_PAGES}")

    def close(self) -> None:
        self._mover.wait()
        if self._checkpoints is not None:
            self._checkpoints.stop()
        self._db.close()


class _AnchorMover:
    """Moves the head anchor on a thread of its own, to the latest head handed to it
    (heads handed over while it writes are one move). ``_write_anchor`` takes the
    anchor's lock file, so it never races another writer's move, this process's
    included; it skips a head the anchor already reaches."""

    def __init__(self, write: Callable[[int, str], bool]) -> None:
        self._write = write
        self._changed = threading.Condition()
        self._wanted: tuple[int, str] | None = None
        self._writing = False
        self._thread: threading.Thread | None = None

    def move(self, head: tuple[int, str]) -> None:
        with self._changed:
            if self._wanted is None or head[0] > self._wanted[0]:
                self._wanted = head
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tillerman-anchor", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def wait(self) -> None:
        """Until every head handed over is written (or its write failed)."""
        with self._changed:
            self._changed.wait_for(lambda: self._wanted is None and not self._writing)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._wanted is not None)
                head, self._wanted, self._writing = self._wanted, None, True
            try:
                self._write(*head)
            finally:
                with self._changed:
                    self._writing = False
                    self._changed.notify_all()


class _Bulk:
    """Where a ``bulk()`` block's appends reached: the head the next one chains to."""

    def __init__(self, head: tuple[int, str]) -> None:
        self.head = head
        self.broken = False  # the ledger failed inside the block: it is rolled back


def _result(prepared: Prepared) -> AppendResult:
    return AppendResult(tuple(row.entry() for row in prepared.rows), prepared.duplicates, prepared.conflicts)


def _chunks(seqs: Sequence[int]) -> Iterator[Sequence[int]]:
    for start in range(0, len(seqs), _IN_CHUNK):
        yield seqs[start : start + _IN_CHUNK]


def _file_key(st: os.stat_result) -> tuple[int, ...]:
    """What changes when a file is replaced or written (the times in nanoseconds)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _meta(db: sqlite3.Connection, key: str) -> str | None:
    """A ``meta`` value; None also for a ledger older than the table (read, not migrated)."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return row[0] if row else None


def _connect_readonly(path: str) -> tuple[sqlite3.Connection, str | None]:
    """Open for reading without writing anything. ``mode=ro`` reads a WAL ledger through
    its ``-shm`` index, which SQLite must be able to open or create; where it cannot (a
    read-only file or folder) and no ``-wal`` holds committed rows, ``immutable`` reads
    the file alone. With a non-empty ``-wal`` that would skip committed rows, so then
    the error stands. A file cut mid-page is read as far as its whole pages go, in
    memory, with the damage named (the second value)."""
    if not os.path.exists(path):
        raise OperationalError(f"no ledger at {path}")
    uri = "file:" + urllib.parse.quote(path) + "?mode=ro"
    db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db, None
    except sqlite3.OperationalError:
        db.close()
        wal = ledger_files(path).wal
        if os.path.exists(wal) and os.path.getsize(wal) > 0:
            raise
    except sqlite3.DatabaseError:
        db.close()
        if (salvaged := _whole_pages(path)) is None:
            raise
        return salvaged
    return sqlite3.connect(uri + "&immutable=1", uri=True, isolation_level=None, check_same_thread=False), None


def _whole_pages(path: str) -> tuple[sqlite3.Connection, str] | None:
    """A SQLite file cut mid-page, as far as its whole pages go (None: not that damage)."""
    with open(path, "rb") as fh:
        data = fh.read()
    if not data.startswith(b"SQLite format 3\0") or len(data) < 100:
        return None
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    cut = len(data) % page_size
    if not cut:
        return None
    pages = bytearray(data[: len(data) - cut])
    pages[18:20] = b"\x01\x01"  # read as a rollback-journal file: an in-memory copy has no WAL
    pages[28:32] = (len(pages) // page_size).to_bytes(4, "big")  # the pages that are there
    db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    db.deserialize(bytes(pages))
    return db, f"the file ends {cut} bytes into a page (truncated)"


def _check_readable(db: sqlite3.Connection, version: int) -> None:
    """What ``migrate`` refuses, for a reader (which never migrates: older schemas are read as they are)."""
    if version > SCHEMA_VERSION:
        raise SchemaError(f"ledger schema version {version} is newer than this tillerman understands"
                          f" ({SCHEMA_VERSION}); upgrade tillerman")
    if version == 0:
        raise SchemaError("the file is not a tillerman ledger (no schema)")


def _create_private(path: Path) -> None:
    """Create the ledger file readable by its owner only, before SQLite opens it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
