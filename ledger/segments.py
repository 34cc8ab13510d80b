"""Archive segments: the rows ``tillerman ledger archive`` moved out of the live ledger.

A segment is a SQLite file with the ledger's own schema, in ``LEDGER.segments/``, named
``seq-FIRST-LAST-DIGEST.sqlite3``. It holds the moved rows exactly as they were stored —
seq, payload, digest, ``prev_hash``, ``hash`` — and ``meta.archive_segment`` says it is
a segment and what it holds. Nothing writes to a segment once it is placed; a writable
open of one is refused (``tillerman.ledger.sqlite``).

The live ledger keeps the seqs of its chain, with gaps where rows moved, and a chained
``ledger_archived`` row per segment naming the file, the seq range, the row count and
``rows_digest`` of the moved rows. So:

* ``ChainThrough`` lets ``verify`` walk ONE chain, from genesis to the head anchor, over
  the live rows and every named segment's rows merged in seq order: a row removed from
  either file is a gap, an edited one breaks its hash; and each segment must hold
  exactly the rows its record names (count, range, digest), so a row moved between
  files shows too. A named segment that is missing is a problem; a segment no record
  names (an archive stopped before its commit) is a note: its rows are still live.
* ``merged_history`` reads the live rows and the segments' in seq order: ``SQLiteRecorder.history``,
  for ``ledger export``, ``ledger copy`` and ``replay``. The daemon's fold reads the live
  file only.

The SQLite recorder verifies and reads through this module, and opens its segments
itself (``SQLiteRecorder.open_segment``): this module names the ledger by what it reads
of it (``ArchivedLedger``) and imports no backend.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import os
import re
import sqlite3
from collections.abc import Callable, Collection, Iterable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import Protocol

import msgspec

from tillerman.ledger import events
from tillerman.ledger.batch import entry_of
from tillerman.ledger.errors import IntegrityError, LedgerError, OperationalError, UnsafeOutput
from tillerman.ledger.events import Entry, LedgerArchived
from tillerman.ledger.migrations import EVENT_COLUMNS, migrate
from tillerman.ledger.paths import SQLITE_MAGIC, check_own_file, file_kind, ledger_files
from tillerman.ledger.recorder import VerifyReport
from tillerman.ledger.verify import check_row

#: The ``meta`` key that makes a file an archive segment (its value: the segment's header).
SEGMENT_META = "archive_segment"

_ARCHIVED = events.LedgerArchived.__struct_config__.tag
_NAME = re.compile(r"seq-[0-9]+-[0-9]+-[0-9a-f]{16}\.sqlite3")
_seq = itemgetter(0)
_JOURNAL_MAGIC = b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7"  # SQLite's rollback journal header


class ArchivedLedger(Protocol):
    """What this module reads of a SQLite ledger or segment (``SQLiteRecorder``)."""

    path: str

    def rows(self, after_seq: int = 0, kinds: Collection[str] | None = None) -> Iterator[tuple]:
        """Stored rows (``EVENT_COLUMNS``) with ``seq > after_seq`` in order, undecoded."""

    def open_segment(self, seq: int, marker: LedgerArchived) -> ArchivedLedger:
        """The segment ``marker`` (recorded at ``seq``) names, read-only, to close after use."""


def segment_dir(ledger_path: str | os.PathLike) -> Path:
    """Where a ledger's segments live: ``LEDGER.segments/`` beside it (moved with it,
    like ``LEDGER.head``), named from its real path."""
    return Path(ledger_files(ledger_path).segments)


def segment_name(first_seq: int, last_seq: int, digest: str) -> str:
    """The same rows always get the same name: an archive run again after a crash
    replaces its own unfinished segment and nothing else."""
    return f"seq-{first_seq}-{last_seq}-{digest[:16]}.sqlite3"


class Tally:
    """What a walk saw of one segment's rows: count, first and last seq, ``rows_digest``."""

    def __init__(self) -> None:
        self.rows, self.first, self.last = 0, 0, 0
        self._digest = hashlib.sha256()
        self.done = False  # every row was read

    def add(self, seq: int, link: str) -> None:
        self.rows += 1
        self.first = self.first or seq
        self.last = seq
        self._digest.update(link.encode() + b"\n")

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()

    def differs_from(self, marker: LedgerArchived) -> bool:
        return (self.rows, self.first, self.last, self.digest) != (
            marker.rows, marker.first_seq, marker.last_seq, marker.rows_digest)

    def describe(self) -> str:
        return f"{self.rows} row(s), seqs {self.first}..{self.last}, digest {self.digest[:16]}"


def describe(marker: LedgerArchived) -> str:
    return f"{marker.rows} row(s), seqs {marker.first_seq}..{marker.last_seq}, digest {marker.rows_digest[:16]}"


def markers(recorder: ArchivedLedger) -> list[tuple[int, LedgerArchived]]:
    """The archive records of a ledger, in seq order, each with its seq. Raises
    ``IntegrityError`` for one that cannot name its segment."""
    found = []
    for row in recorder.rows(kinds=(_ARCHIVED,)):
        seq, kind, payload = row[0], row[7], row[11]
        marker = events.decode_stored(payload, kind)
        if not isinstance(marker, LedgerArchived) or not _NAME.fullmatch(marker.segment):
            raise IntegrityError(f"seq {seq}: the archive record does not name a segment file (edited?);"
                                 " `tillerman ledger verify` says more")
        found.append((seq, marker))
    return found


def merged_history(ledger: ArchivedLedger, after_seq: int = 0,
                   kinds: Collection[str] | None = None) -> Iterator[Entry]:
    """Every entry of a SQLite ledger's history with ``seq > after_seq``, live rows and
    archived ones merged in seq order (only ``kinds``, when given: the others are not
    decoded). A named segment that is missing raises ``IntegrityError`` before any entry."""
    with contextlib.ExitStack() as stack:
        streams = [ledger.rows(after_seq, kinds)]
        for seq, marker in markers(ledger):
            if marker.last_seq > after_seq:
                segment = stack.enter_context(ledger.open_segment(seq, marker))
                streams.append(segment.rows(after_seq, kinds))
        for row in heapq.merge(*streams, key=_seq):
            yield entry_of(row)


class ChainThrough:
    """The rows ``verify`` walks: the live ledger's and its named segments', in seq
    order, with what the segments themselves owe (``complete``)."""

    def __init__(self, recorder: ArchivedLedger, live_rows: Iterator[tuple]) -> None:
        self._stack = contextlib.ExitStack()
        self.problems: list[str] = []
        self._tallies: list[tuple[int, LedgerArchived, Tally]] = []
        named: set[str] = set()
        streams = [live_rows]
        try:
            found = markers(recorder)
        except LedgerError as exc:
            self.problems.append(str(exc))
            found = []
        for seq, marker in found:
            named.add(marker.segment)
            try:
                segment = self._stack.enter_context(recorder.open_segment(seq, marker))
            except LedgerError as exc:
                self.problems.append(str(exc))
                continue
            tally = Tally()
            self._tallies.append((seq, marker, tally))
            streams.append(self._tallied(segment, tally))
        self.rows = heapq.merge(*streams, key=_seq)
        self.notes = [f"the archive segment {path} is named by no archive record: an archive stopped before its"
                      " commit (its rows are still in the ledger); `ledger archive` again replaces it, or delete it"
                      for path in _unnamed(recorder.path, named)]

    def _tallied(self, segment: ArchivedLedger, tally: Tally) -> Iterator[tuple]:
        try:
            for row in segment.rows():
                tally.add(row[0], row[14])
                yield row
        except LedgerError as exc:
            self.problems.append(f"the archive segment {segment.path} cannot be read after seq {tally.last}: {exc}")
            return
        tally.done = True

    def complete(self, report: VerifyReport) -> VerifyReport:
        """The walk's report with the segments' problems and notes added."""
        problems = list(self.problems)
        for seq, marker, tally in self._tallies:
            if tally.done and tally.differs_from(marker):
                problems.append(f"the archive segment {marker.segment} holds {tally.describe()}, but its record at"
                                f" seq {seq} names {describe(marker)}: rows were added to it, taken out or edited")
            elif tally.done and marker.last_seq >= seq:
                problems.append(f"seq {seq}: the archive record names rows after itself (edited?)")
        problems += report.problems
        return msgspec.structs.replace(report, ok=not problems, problems=tuple(problems),
                                       notes=report.notes + tuple(self.notes))

    def __enter__(self) -> ChainThrough:
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()


def _unnamed(ledger_path: str, named: set[str]) -> list[Path]:
    folder = segment_dir(ledger_path)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.fullmatch(p.name) and p.name not in named)


def verify_alone(segment: ArchivedLedger, header: str) -> VerifyReport:
    """A segment checked without its ledger: every row against its own hash, the links
    between rows with consecutive seqs, and what the segment says it holds. The links
    to the rows around it are the live ledger's walk."""
    problems: list[str] = []
    tally, prev = Tally(), None
    try:
        claimed = msgspec.json.decode(header, type=LedgerArchived)
    except msgspec.DecodeError:
        claimed, problems = None, [f"{segment.path}: the segment header does not decode (edited?)"]
    try:
        for row in segment.rows():
            seq, prev_hash, link = row[0], row[13], row[14]
            if prev is not None and seq == prev[0] + 1 and prev_hash != prev[1]:
                problems.append(f"seq {seq}: prev_hash does not match the hash of seq {seq - 1}")
            _, problem = check_row(row)
            if problem:
                problems.append(f"seq {seq}: {problem}")
            if problems:
                break
            tally.add(seq, link)
            prev = (seq, link)
    except LedgerError as exc:
        problems.append(f"rows after seq {tally.last} cannot be read ({exc})")
    if not problems and claimed is not None and tally.differs_from(claimed):
        problems.append(f"the segment holds {tally.describe()}, but its header names {describe(claimed)}")
    note = (f"{segment.path} is an archive segment: each row is checked against its own hash; the links to the"
            " rows around it, and the segment against its record, are checked by verifying the live ledger")
    return VerifyReport(ok=not problems, rows=tally.rows, last_seq=tally.last, problems=tuple(problems),
                        notes=(note,))


def write_segment(folder: Path, rows: Iterable[tuple], header: Callable[[Tally], LedgerArchived],
                  checkpoint: Callable[[str], None] = lambda point: None) -> tuple[Path, Tally]:
    """Write ``rows`` (``EVENT_COLUMNS``, in seq order) into a new segment in ``folder`` and put
    it in place under its name, durably: the file is written under a temporary name and
    fsynced, then renamed, and the folder fsynced. ``header(tally)`` gives what the segment
    says it holds. Returns its path and what it holds.

    Each name written in the folder is checked first (``check_own_file``): nothing there,
    or what an archive stopped before its end left (replaced). A symlink, a FIFO, a device,
    a directory or a foreign file at a name is refused (``UnsafeOutput``) with the ledger
    unchanged: the segment is placed before any row moves."""
    _made_folder(folder)
    tmp = folder / "archive.tmp"
    # What an archive stopped midway left is removed (SQLite would take a stale journal for the new file's).
    check_own_file(tmp, "the archive segment being written", ours=_is_sqlite_file).unlink(missing_ok=True)
    check_own_file(f"{tmp}-journal", "the archive segment's journal", ours=_is_journal).unlink(missing_ok=True)
    os.close(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    tally = Tally()
    db = sqlite3.connect(tmp, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = DELETE")  # one file, nothing beside it
        db.execute("PRAGMA synchronous = FULL")
        db.execute("BEGIN IMMEDIATE")
        migrate(db)
        # No key beside the ids: a segment is never appended to, so every row stays under
        # the id's own index (``events_unkeyed``), which keeps them unique.
        insert = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES ({', '.join('?' * 15)})"
        for chunk in _batches(rows, tally):
            db.executemany(insert, chunk)
        claimed = header(tally)
        db.execute("INSERT INTO meta (key, value) VALUES (?, ?)",
                   (SEGMENT_META, msgspec.json.encode(claimed).decode()))
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        tmp.unlink(missing_ok=True)
        raise OperationalError(f"cannot write the archive segment {tmp}: {exc}; nothing was moved") from exc
    finally:
        db.close()
    _fsync(tmp)
    checkpoint("segment_written")
    try:  # an unfinished segment of the same rows (same name) is replaced; nothing else is
        path = check_own_file(folder / claimed.segment, "the archive segment", ours=_is_sqlite_file)
    except UnsafeOutput:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    _fsync(folder)
    checkpoint("segment_placed")
    return path, tally


def _made_folder(folder: Path) -> None:
    """The segment folder, made when missing; something other than a folder (or a
    symlink to one: segments may live on another disk) at its name is refused."""
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        if not folder.is_dir():
            kind = "a symlink" if folder.is_symlink() else file_kind(folder.lstat())
            raise UnsafeOutput(f"cannot write the archive segment folder {folder}: it is {kind}, not a folder;"
                               " move it away") from None


def _is_sqlite_file(head: bytes) -> bool:
    """A SQLite file, or an empty one (made, then stopped before SQLite wrote to it)."""
    return head.startswith(SQLITE_MAGIC) or not head


def _is_journal(head: bytes) -> bool:
    return head.startswith(_JOURNAL_MAGIC) or not head


def _batches(rows: Iterable[tuple], tally: Tally, size: int = 1000) -> Iterator[list[tuple]]:
    batch: list[tuple] = []
    for row in rows:
        tally.add(row[0], row[14])
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    yield batch


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

