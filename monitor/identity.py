"""Deterministic identity for file-derived events.

A file is identified by its device, inode and a digest of its first line, so a file
truncated and rewritten in place is a new generation while a file that only grows
keeps its identity. An event id is that identity plus the record's byte offset and
the event's index among those the record yielded: re-reading any span of the file
yields the same ids, and the ledger stores each fact once.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable

FIRST_LINE_LIMIT = 4096  # enough to tell generations apart without reading a huge line


def file_identity(path: str | os.PathLike, first_line: bytes) -> str:
    return stat_identity(os.stat(path), first_line)


def stat_identity(st: os.stat_result, first_line: bytes) -> str:
    """``file_identity`` of an already-stat'ed (or open) file."""
    head = hashlib.sha256(first_line[:FIRST_LINE_LIMIT]).hexdigest()[:16]
    return f"{st.st_dev}:{st.st_ino}:{head}"


def read_first_line(path: str | os.PathLike) -> bytes:
    with open(path, "rb") as fh:
        return fh.readline(FIRST_LINE_LIMIT)


def file_event_id(identity: str, offset: int, index: int) -> str:
    return _event_id(f"{identity}|".encode(), offset, index)


def event_ids(identity: str) -> Callable[[int, int], str]:
    """``file_event_id`` of one file, its identity encoded once: ``ids(offset, index)``."""
    return functools.partial(_event_id, f"{identity}|".encode())


def _event_id(prefix: bytes, offset: int, index: int) -> str:
    return "f-" + hashlib.sha256(prefix + b"%d|%d" % (offset, index)).hexdigest()[:32]
