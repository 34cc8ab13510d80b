"""Which files of a replay must run together, in one projection on one clock.

Replay evaluates timers for every thread it has folded so far: were two unrelated
files run in one projection, the second file's clock would fire the first file's
rule timers (a stall "for 400 days" between two recordings a year apart) and decide
its intents. So each group of files replays on its own, and groups never see each
other's state; that is also what lets them run in parallel.

A group is a thread family: the files that name a common thread
(``tillerman.monitor.file_threads``: a rollout and its forks and subagents, a Claude
transcript and its subagent files, the same thread recorded in two formats) and the
same file named twice (one identity: its events are stored once). A file whose
opening names no thread is a group of its own. Pure: the caller reads the files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class ReplayFile(NamedTuple):
    path: str
    identity: str  # device and inode: two names of one file are one file
    threads: frozenset[str]  # the threads its opening names (its own, its parent's)


def group_files(files: Sequence[ReplayFile]) -> list[list[int]]:
    """The files' indices, grouped: files sharing a thread or an identity are one group.
    Groups come in the order of their first file, each file in the given order, so the
    grouping (and a merge in this order) is the same however many workers run it."""
    parent = list(range(len(files)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[tuple[str, str], int] = {}  # a thread or identity -> the first file naming it
    for index, file in enumerate(files):
        for key in (("file", file.identity), *(("thread", t) for t in sorted(file.threads))):
            first = owner.setdefault(key, index)
            a, b = root(first), root(index)
            if a != b:
                parent[max(a, b)] = min(a, b)  # the earlier file stays the root
    groups: dict[int, list[int]] = {}
    for index in range(len(files)):
        groups.setdefault(root(index), []).append(index)
    return list(groups.values())
