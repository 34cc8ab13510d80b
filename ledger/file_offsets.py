"""Where each followed file was read up to: the file tailer's resumable position.

One row per *generation* of a file (its identity: device, inode and a digest of its
first line). ``offset`` is the end of the last complete line whose events are in the
ledger; it is written in the same transaction as those events, so after a crash the
tailer resumes exactly there: nothing lost, nothing appended twice. A partial last
line is never counted, so ``offset`` always sits on a line boundary.
"""

from __future__ import annotations

from typing import Literal

import msgspec

#: following: read as it grows; deleted: gone from the followed set (recorded as a
#: ``quarantined{reason: file_deleted}`` event); replaced: another file took its path
#: (it may reappear elsewhere, a rotation, and is then followed on from its offset).
OffsetState = Literal["following", "deleted", "replaced"]


class FileOffset(msgspec.Struct, frozen=True, kw_only=True):
    identity: str  # device:inode:first-line digest (tillerman.monitor.identity)
    path: str  # where the file was last seen
    source: str  # the source its events carry (file:<path where it was first seen>)
    format: str  # the parser that reads it
    offset: int  # bytes consumed: every complete line before this is in the ledger
    state: OffsetState = "following"
    updated_at: float = 0.0
