"""Retention: move the rows of threads closed before a time into an archive segment.

What moves (``plan``), decided from the fold and the rows:

* a thread is closed before T when every row of it (observations, reports, and its
  intents' records) happened and was recorded before T — the later of ``at`` and
  ``observed_at`` — and no open (non-terminal) intent is on it, nor an intent such an
  open intent supersedes;
* such a thread's rows move, with every row of every intent on it (all terminal);
* a row of an intent that stays never moves, and rows with no thread (rule sets
  loaded or rejected, rule proposals and promotions, accepted tails, earlier archive
  records) always stay: they are few, and ``replay --check`` and ``rules`` read them.

How (``archive``), under the daemon's ledger lock (no daemon may run meanwhile), on a
ledger that verifies: the moved rows are copied verbatim into a segment written under a
temporary name, fsynced and renamed into ``LEDGER.segments/``
(``tillerman.ledger.segments``); then ONE durable transaction appends the chained
``ledger_archived`` record and deletes the rows (refused if anything written since the
plan touches them); then the head anchor moves and ``VACUUM`` gives the space back.
A crash at any point leaves a ledger that verifies: before the commit the rows are all
still live and a placed segment is an unnamed leftover that a second run replaces;
after it only the anchor (it lags, which is allowed) or the VACUUM is left, and a
second run, finding nothing more to move, vacuums. The steps are named in
``CHECKPOINTS`` for fault tests.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import msgspec

from tillerman.ledger import projections
from tillerman.ledger.errors import IntegrityError, LedgerError
from tillerman.ledger.events import LedgerArchived
from tillerman.ledger.lock import LedgerLock
from tillerman.ledger.paths import ledger_files
from tillerman.ledger.segments import segment_dir, segment_name, write_segment
from tillerman.ledger.sqlite import SQLiteRecorder

#: Where an archive may be interrupted, in order: ``segment_written`` — the segment is
#: written and fsynced under its temporary name; ``segment_placed`` — it is renamed into
#: place, the ledger unchanged; ``rows_moved`` — the record and the deletion are
#: committed, the head anchor not yet moved; ``anchor_moved`` — only the VACUUM is left.
CHECKPOINTS = ("segment_written", "segment_placed", "rows_moved", "anchor_moved")


class ArchivePlan(msgspec.Struct, frozen=True):
    before: float
    through_seq: int  # the plan covers the rows up to this seq
    threads: frozenset[str]
    intents: frozenset[str]
    seqs: tuple[int, ...]  # the rows that move, in order
    kept_threads: int  # threads closed before T that stay for an open intent


class ArchiveResult(msgspec.Struct, frozen=True):
    ledger: str
    before: float
    dry_run: bool
    threads: int
    intents: int
    rows: int
    kept_threads: int
    first_seq: int | None = None
    last_seq: int | None = None
    segment: str | None = None  # its path; None when nothing moved
    record_seq: int | None = None  # the live ledger's ``ledger_archived`` row
    bytes_before: int = 0
    bytes_after: int = 0


def plan(recorder: SQLiteRecorder, before: float) -> ArchivePlan:
    """Which threads, intents and rows move (see the module docstring)."""
    projection = projections.load(recorder)
    open_views = projection.open_intents()
    pinned = {v.intent.id for v in open_views} | {v.intent.supersedes for v in open_views if v.intent.supersedes}
    pinned_threads = {projection.intents[i].intent.thread_id for i in pinned if i in projection.intents}
    last_active: dict[str, float] = {}
    keys: list[tuple[int, str | None, str | None]] = []
    through = 0
    for row in recorder.rows():
        seq, at, observed_at, thread_id, intent_id = row[0], row[2], row[3], row[5], row[8]
        when = observed_at if at is None else max(at, observed_at)
        if thread_id is not None:
            thread_id = sys.intern(thread_id)
            last_active[thread_id] = max(last_active.get(thread_id, when), when)
            if intent_id in pinned:
                pinned_threads.add(thread_id)
        keys.append((seq, thread_id, intent_id))
        through = seq
    closed = {t for t, when in last_active.items() if when < before}
    threads = closed - pinned_threads
    intents = {i for i, v in projection.intents.items() if v.intent.thread_id in threads}
    staying = projection.intents.keys() - intents
    seqs = tuple(seq for seq, t, i in keys if (t in threads or i in intents) and i not in staying)
    return ArchivePlan(before=before, through_seq=through, threads=frozenset(threads),
                       intents=frozenset(intents), seqs=seqs, kept_threads=len(closed & pinned_threads))


def archive(path: str | os.PathLike, before: float, *, dry_run: bool = False,
            checkpoint: Callable[[str], None] = lambda point: None) -> ArchiveResult:
    """Archive the threads of the ledger at ``path`` closed before ``before`` (see the
    module docstring). Raises ``LedgerLocked`` while a daemon owns the ledger and
    ``IntegrityError`` when it does not verify; ``dry_run`` only plans (read-only)."""
    path = ledger_files(path).path  # the daemon's lock and the segments are named from the real path
    lock = LedgerLock(path, advice="stop it before archiving: the archive moves rows the daemon reads")
    if not dry_run:
        lock.acquire()
    try:
        with SQLiteRecorder(path, readonly=dry_run) as recorder:
            return _archive(recorder, before, dry_run, checkpoint)
    finally:
        lock.release()


def _archive(recorder: SQLiteRecorder, before: float, dry_run: bool,
             checkpoint: Callable[[str], None]) -> ArchiveResult:
    report = recorder.verify()
    if not report.ok:
        raise IntegrityError(f"the ledger does not verify ({report.problems[0]}); nothing was archived."
                             " `tillerman ledger verify` says more")
    size_before = _size(recorder.path)
    chosen = plan(recorder, before)
    result = ArchiveResult(ledger=recorder.path, before=before, dry_run=dry_run, threads=len(chosen.threads),
                           intents=len(chosen.intents), rows=len(chosen.seqs), kept_threads=chosen.kept_threads,
                           first_seq=chosen.seqs[0] if chosen.seqs else None,
                           last_seq=chosen.seqs[-1] if chosen.seqs else None,
                           bytes_before=size_before, bytes_after=size_before)
    if dry_run:
        return result
    if not chosen.seqs:
        if recorder.free_pages():  # an archive stopped before its VACUUM
            recorder.vacuum()
        return msgspec.structs.replace(result, bytes_after=_size(recorder.path))
    moved = set(chosen.seqs)

    def record(tally) -> LedgerArchived:
        return LedgerArchived(segment=segment_name(tally.first, tally.last, tally.digest), first_seq=tally.first,
                              last_seq=tally.last, rows=tally.rows, rows_digest=tally.digest, before=before,
                              threads=len(chosen.threads), intents=len(chosen.intents))

    rows = (row for row in recorder.rows() if row[0] in moved)
    segment, tally = write_segment(segment_dir(recorder.path), rows, record, checkpoint)
    try:
        record_seq = recorder.archive_commit(chosen.seqs, record(tally), planned_through=chosen.through_seq,
                                             threads=chosen.threads, intents=chosen.intents, at=time.time(),
                                             checkpoint=checkpoint)
    except LedgerError:
        segment.unlink(missing_ok=True)  # rolled back: every row is still live
        raise
    checkpoint("anchor_moved")
    recorder.vacuum()
    return msgspec.structs.replace(result, segment=str(segment), record_seq=record_seq,
                                   bytes_after=_size(recorder.path))


def _size(path: str) -> int:
    """The ledger's bytes on disk: the file and its WAL."""
    return sum(os.path.getsize(p) for p in (path, ledger_files(path).wal) if os.path.exists(p))
