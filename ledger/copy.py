"""``tillerman ledger copy``: a ledger's whole history into an empty ledger of either
backend (SQLite to PostgreSQL and back), then proven the same.

Every entry is offered to the target again, in order, as an ordinary append: the target
prepares it as it prepares any write (the intent table checked, the content digest and
the chain link computed afresh), so a copy that ends at the source's chain head — the
same seq and hash — holds the same rows, byte for byte, and is a ledger in its own
right. Each append's returned entries are compared with the source's as it goes, so a
difference is named at its seq, and the target is verified at the end. An archived
SQLite ledger's segments are read too (``Recorder.history``): the copy holds the whole
history in one place.
"""

from __future__ import annotations

import itertools

import msgspec

from tillerman.ledger import events
from tillerman.ledger.errors import IntegrityError, LedgerError
from tillerman.ledger.recorder import GENESIS, Recorder

CHUNK = 2000  # entries per target transaction: bounded memory, few commits


class CopyResult(msgspec.Struct, frozen=True):
    rows: int
    last_seq: int
    head: str  # the chain hash both ledgers end at
    file_offsets: int


class TargetNotEmpty(LedgerError):
    """The target ledger already holds rows: a copy never merges two histories."""


def copy_ledger(source: Recorder, target: Recorder) -> CopyResult:
    """Copy ``source`` into the empty ``target`` and verify it. Raises ``TargetNotEmpty``,
    or ``IntegrityError`` for a source that does not verify, a row this version cannot
    decode, or a copy that differs (the target then holds what was copied before)."""
    if target.max_seq():
        raise TargetNotEmpty(f"the target ledger already holds {target.max_seq()} rows; copy into an empty one")
    report = source.verify()
    if not report.ok:
        raise IntegrityError(f"the source ledger does not verify ({report.problems[0]}); nothing was copied")
    copied, head = 0, GENESIS
    history = source.history()
    while chunk := list(itertools.islice(history, CHUNK)):
        for entry in chunk:
            if isinstance(entry.envelope.event, events.Undecodable):
                raise IntegrityError(f"seq {entry.seq} does not decode with this tillerman"
                                     f" ({entry.envelope.event.error}); copy with the version that wrote it")
        written = target.append([entry.envelope for entry in chunk]).entries  # one transaction
        if list(written) != chunk:
            differs = next(a or b for a, b in itertools.zip_longest(chunk, written) if a != b)
            raise IntegrityError(f"the copy differs from the source at seq {differs.seq};"
                                 f" the target holds the {copied} rows copied before that chunk")
        copied += len(chunk)
        head = chunk[-1].hash
    offsets = source.file_offsets()
    if offsets:
        target.append([], offsets=offsets)
    check = target.verify()
    if not check.ok:
        raise IntegrityError(f"the copy does not verify: {check.problems[0]}")
    return CopyResult(rows=copied, last_seq=check.last_seq, head=head, file_offsets=len(offsets))
