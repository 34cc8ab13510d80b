"""The SQLite ledger: one file, WAL, ``BEGIN IMMEDIATE`` writes, a busy timeout.

Several processes may append at once (the daemon, ``tillerman intent propose``): each
batch takes the write lock, reads the chain head inside its transaction, and commits
contiguous seqs. The head (last seq and hash) is also anchored in a file beside the
database, rewritten after each commit under a file lock, so ``verify`` catches a
tail cut off the table.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from ledger import events
from ledger.batch import prepare, row_columns
from ledger.errors import IntegrityError, OperationalError, SchemaError
from ledger.events import Entry, Envelope
from ledger.file_offsets import FileOffset
from ledger.intent_states import State
from ledger.migrations import SCHEMA_VERSION, migrate
from ledger.recorder import (
    GENESIS,
    AppendResult,
    Recorder,
    VerifyReport,
)

BUSY_TIMEOUT_MS = 10_000
_IN_CHUNK = 500  # bound on `IN (...)` parameters per query

_COLUMNS = (
    "seq, event_id, at, observed_at, source, thread_id, turn_id, kind, intent_id,"
    " offset, length, payload, digest, prev_hash, hash"
)


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
    if isinstance(exc, sqlite3.DatabaseError):
        return SchemaError(f"not a readable tillerman ledger: {message}")
    return OperationalError(message)


class SQLiteRecorder(Recorder):
    def __init__(self, path: str | Path = ":memory:", *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        # Absolute from here on: a reader of the WAL's change events sees absolute paths,
        # and a later chdir must not move the ledger.
        self.memory = str(path) == ":memory:"
        self.path = str(path) if self.memory else os.path.abspath(path)
        self.head_path = None if self.memory else Path(self.path + ".head")
        if not self.memory:
            _create_private(Path(self.path))
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            if not self.memory:
                self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            if self._db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                with self._transaction():  # only a migration needs the write lock to open
                    migrate(self._db)
        except sqlite3.Error as exc:
            raise _translate(exc) from exc
        self._heal_anchor()

    # -- transactions -----------------------------------------------------------

    @contextlib.contextmanager
    def _transaction(self, durable: bool = False) -> Iterator[sqlite3.Connection]:
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
        except sqlite3.Error as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise _translate(exc) from exc
        finally:
            if durable:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("PRAGMA synchronous = NORMAL")

    # -- append -----------------------------------------------------------------

    def append(self, batch: Sequence[Envelope], *, durable: bool = False,
               offsets: Sequence[FileOffset] = ()) -> AppendResult:
        """``offsets``: file tailer positions, written in the same transaction as the
        events read from those spans (the last one per identity wins)."""
        if not batch and not offsets:
            return AppendResult()
        with self._transaction(durable) as db:
            if offsets:
                self._save_offsets(db, offsets, time.time())
            head_seq, head_hash = self._head(db)
            prepared = prepare(batch, head_seq, head_hash, time.time(),
                               lambda ids: self._known_digests(db, ids),
                               lambda intent_id: self._intent_state(db, intent_id))
            db.executemany(f"INSERT INTO events ({_COLUMNS}) VALUES ({', '.join('?' * 15)})",
                           [row_columns(row) for row in prepared.rows])
        if prepared.rows:
            self._write_anchor(prepared.rows[-1].seq, prepared.rows[-1].hash)
        return AppendResult(tuple(row.seq for row in prepared.rows), prepared.duplicates, prepared.conflicts)

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
        found: dict[str, str] = {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), _IN_CHUNK):
            chunk = unique[start : start + _IN_CHUNK]
            marks = ", ".join("?" * len(chunk))
            found.update(db.execute(f"SELECT event_id, digest FROM events WHERE event_id IN ({marks})", chunk))
        return found

    def _intent_state(self, db: sqlite3.Connection, intent_id: str) -> State | None:
        row = db.execute(
            "SELECT kind, payload FROM events WHERE intent_id = ?"
            " AND kind IN ('intent_proposed', 'intent_transition') ORDER BY seq DESC LIMIT 1",
            (intent_id,),
        ).fetchone()
        if row is None:
            return None
        return State.PROPOSED if row[0] == "intent_proposed" else State(events.decode(row[1]).to_state)

    # -- read -------------------------------------------------------------------

    def read(self, after_seq: int = 0, limit: int | None = None) -> Iterator[Entry]:
        sql = f"SELECT {_COLUMNS} FROM events WHERE seq > ? ORDER BY seq"
        params: tuple = (after_seq,)
        if limit is not None:
            sql += " LIMIT ?"
            params += (limit,)
        try:
            cursor = self._db.execute(sql, params)
            while chunk := cursor.fetchmany(1000):
                for row in chunk:
                    yield _entry(row)
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    def max_seq(self) -> int:
        row = self._db.execute("SELECT max(seq) FROM events").fetchone()
        return row[0] or 0

    def data_version(self) -> int:
        """Changes when another connection commits: a cheap "anything new?" probe."""
        return self._db.execute("PRAGMA data_version").fetchone()[0]

    def intent_entries(self, intent_id: str) -> list[Entry]:
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM events WHERE intent_id = ? ORDER BY seq", (intent_id,)
        ).fetchall()
        return [_entry(r) for r in rows]

    # -- snapshots --------------------------------------------------------------

    def load_snapshot(self, name: str) -> tuple[int, bytes] | None:
        row = self._db.execute("SELECT seq, state FROM snapshots WHERE name = ?", (name,)).fetchone()
        return (row[0], bytes(row[1])) if row else None

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
        from ledger.verify import verify_rows  # the walk is backend-independent

        try:
            cursor = self._db.execute(f"SELECT {_COLUMNS} FROM events ORDER BY rowid")
            integrity = [r[0] for r in self._db.execute("PRAGMA integrity_check")]
            return verify_rows(iter(cursor), integrity, self._read_anchor())
        except sqlite3.Error as exc:
            return VerifyReport(ok=False, rows=0, last_seq=0, problems=(f"unreadable: {exc}",))

    # -- the head anchor --------------------------------------------------------

    def _read_anchor(self) -> tuple[int, str] | None:
        if self.head_path is None or not self.head_path.exists():
            return None
        try:
            data = json.loads(self.head_path.read_text())
            return int(data["seq"]), str(data["hash"])
        except (ValueError, KeyError, TypeError, OSError):
            return (-1, "unreadable")

    def _write_anchor(self, seq: int, link: str) -> None:
        """Rewrite the head file unless another writer already anchored a later seq."""
        if self.head_path is None:
            return
        fd = os.open(self.head_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = self._read_anchor()
            if current is not None and current[0] >= seq:
                return
            tmp = self.head_path.with_name(self.head_path.name + f".{os.getpid()}.tmp")
            tmp_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(tmp_fd, "w") as fh:
                fh.write(json.dumps({"seq": seq, "hash": link, "schema": SCHEMA_VERSION}))
            os.replace(tmp, self.head_path)
        finally:
            os.close(fd)

    def _heal_anchor(self) -> None:
        """After a crash between COMMIT and the anchor write, the anchor lags: catch it
        up, but only when the rows it anchors are intact (otherwise verify must see it)."""
        if self.head_path is None:
            return
        anchor = self._read_anchor()
        seq, link = self._head(self._db)
        if anchor is None and seq == 0:
            return
        if anchor is None or anchor[0] < seq:
            at = self._db.execute("SELECT hash FROM events WHERE seq = ?", (anchor[0],)).fetchone() if anchor else None
            if anchor is None or (at is not None and at[0] == anchor[1]):
                self._write_anchor(seq, link)

    def close(self) -> None:
        self._db.close()


def _entry(row: tuple) -> Entry:
    (seq, event_id, at, observed_at, source, thread, turn, kind, _intent,
     offset, length, payload, _digest, prev_hash, link) = row
    env = Envelope(
        event_id=event_id, event=events.decode_stored(payload, kind, thread, turn), source=source, at=at,
        observed_at=observed_at, offset=offset, length=length,
    )
    return Entry(seq=seq, envelope=env, prev_hash=prev_hash, hash=link)


def _create_private(path: Path) -> None:
    """Create the ledger file readable by its owner only, before SQLite opens it."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
