"""Replay of many files on several processes, with the result of one.

The files are grouped into thread families (``tillerman.controller.replay.groups``);
each group replays on its own ``Replayer`` with an in-memory ledger, in a worker
process (``--jobs N``) or one after another in this one (``--jobs 1``). Results are
merged in group order, whatever order the workers finish in: the files in the order
they were named, counts summed, the decisions digest over every group's decision
lines in turn. With a ledger, ``--jobs 1`` replays each group straight into it (flat
memory, as a single replay); workers replay into memory and the parent appends each
group's entries in that same order (``_appender``). Into a fresh ledger, both write the
same rows (seqs, hash chain, export) for any number of jobs, and its decision rows in
seq order are the digested stream. (Into a ledger that already holds some of the
events, ``--jobs 1`` folds only what the append stores, a worker everything it read.)

Without a ledger, and while the parent runs no other thread, workers are forked from
the parent: it has imported everything they run, so a worker starts in milliseconds
(a ``forkserver`` first imports tillerman again: about 0.3 s on a quiet machine, 1 s on
a busy one, before the first worker starts). Otherwise they are started by
``forkserver`` (``spawn`` where there is none), so they never inherit the parent's open
ledger (SQLite does not support a connection carried across a fork) nor a thread's
held lock. They ignore SIGINT; Ctrl-C reaches the parent, which terminates them.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from tillerman.controller.replay.groups import ReplayFile, group_files
from tillerman.controller.replay.replayer import (
    BATCH,
    Progress,
    Replayer,
    ReplaySummary,
    files_read_once,
    read_head,
    worth_loading,
)
from tillerman.ledger.chain_only import ChainOnlyRecorder
from tillerman.ledger.command_patterns import DEFAULT as DEFAULT_PATTERNS
from tillerman.ledger.command_patterns import CommandPatterns
from tillerman.ledger.events import Envelope
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.recorder import Recorder
from tillerman.monitor.file_threads import file_threads
from tillerman.monitor.formats import detect_format
from tillerman.monitor.tailer import is_file_source
from tillerman.rules.review import Reviewer
from tillerman.rules.ruleset import RuleSet


class ReplaySettings(msgspec.Struct, frozen=True, kw_only=True):
    """What every group's ``Replayer`` is built with (sent once to each worker)."""

    ruleset: RuleSet
    fmt: str = "auto"
    patterns: CommandPatterns = DEFAULT_PATTERNS
    retain_payloads: bool = False
    keep_entries: bool = False  # a ledger is written: return every entry recorded
    reviewers: tuple[Reviewer, ...] = ()  # [[reviewer]]: recorded answers used, new checkpoints held
    review: bool = False  # --review: new checkpoints are asked
    # Each file parsed in a child process while the group folds: for a replay in this
    # process with a core to spare (``--jobs`` 2 or more, one group), never in a worker.
    parse_ahead: bool = False


class GroupResult(msgspec.Struct, frozen=True):
    summary: ReplaySummary
    decision_lines: bytes  # the group's lines of the decisions digest, in order
    # With keep_entries: the recorded envelopes in seq order, BATCH of them per msgpack
    # chunk, so the parent holds one chunk decoded at a time, not a whole group's.
    envelopes: list[bytes]


_envelopes = msgspec.msgpack.Decoder(list[Envelope])


def replay_files(paths: list[str], settings: ReplaySettings, *, jobs: int = 1, ledger: Recorder | None = None,
                 progress: Progress | None = None) -> ReplaySummary:
    """Replay ``paths`` (files, as ``collect_files`` found them) in thread groups on up to
    ``jobs`` processes; with ``ledger``, record everything into it, group by group."""
    files = [_replay_file(path, settings.fmt) for path in paths]
    groups = [[paths[i] for i in group] for group in group_files(files)]
    meter = _Meter(progress, sum(_size(p) for p in dict.fromkeys(paths))) if progress else None
    if jobs <= 1 or len(groups) == 1:  # in this process, each group straight into the ledger
        settings = msgspec.structs.replace(settings, parse_ahead=jobs > 1)
        results = (replay_group(settings, group, meter, ledger) for group in groups)
        return _merge(paths, groups, results, settings.ruleset)
    settings = msgspec.structs.replace(settings, keep_entries=ledger is not None)
    results = _in_pool(settings, groups, min(jobs, len(groups)), meter)
    if ledger is None:
        return _merge(paths, groups, results, settings.ruleset)
    with _appender(ledger, _loads(paths, settings.fmt)) as append:
        return _merge(paths, groups, (append(result) for result in results), settings.ruleset)


def replay_group(settings: ReplaySettings, paths: list[str], progress: Progress | None,
                 ledger: Recorder | None = None) -> GroupResult:
    """One group on its own ``Replayer``: into ``ledger``, else into memory (a worker's
    entries go back to the parent with ``keep_entries``)."""
    lines: list[bytes] = []
    keep = settings.keep_entries and ledger is None
    # A worker hands its rows to the parent's ledger; otherwise only the chain head is kept.
    recorder = ledger if ledger is not None else MemoryRecorder() if keep else ChainOnlyRecorder()
    summary = Replayer(recorder, settings.ruleset, fmt=settings.fmt, patterns=settings.patterns,
                       retain_payloads=settings.retain_payloads, progress=progress,
                       on_decision=lines.append, reviewers=settings.reviewers, review=settings.review,
                       parse_ahead=settings.parse_ahead).run(paths)
    recorded = [entry.envelope for entry in recorder.read()] if keep else []
    envelopes = [msgspec.msgpack.encode(recorded[start:start + BATCH]) for start in range(0, len(recorded), BATCH)]
    return GroupResult(summary, b"".join(lines), envelopes)


def _merge(paths: list[str], groups: list[list[str]], results: Iterator[GroupResult],
           ruleset: RuleSet) -> ReplaySummary:
    by_path: dict[str, list] = {}  # a path named twice has a summary per naming
    digest = hashlib.sha256()
    events = decisions = reports = 0
    intents: Counter[str] = Counter()
    overdue: list[dict] = []
    reviews: dict[str, Counter[str]] = {}
    reviewed = False
    goals: list[dict] = []
    for group, result in zip(groups, results, strict=True):
        summary = result.summary
        for path, file in zip(group, summary.files, strict=True):
            by_path.setdefault(path, []).append(file)
        digest.update(result.decision_lines)
        events, decisions, reports = events + summary.events, decisions + summary.decisions, reports + summary.reports
        intents.update(summary.intents)
        overdue.extend(summary.overdue)
        if summary.goals is not msgspec.UNSET:
            goals.extend(summary.goals)
        if summary.reviews is not msgspec.UNSET:  # reviewers configured: counted, even when none
            for kind, said in summary.reviews.items():
                reviews.setdefault(kind, Counter()).update(said)
            reviewed = True
    return ReplaySummary(
        files=[by_path[path].pop(0) for path in paths], events=events, decisions=decisions,
        decisions_digest="sha256:" + digest.hexdigest(), reports=reports, intents=dict(sorted(intents.items())),
        overdue=overdue, ruleset_digest=ruleset.digest,
        reviews={kind: dict(sorted(said.items())) for kind, said in sorted(reviews.items())}
        if reviewed else msgspec.UNSET,
        goals=sorted(goals, key=lambda g: g["thread"]) or msgspec.UNSET,
    )


def _loads(paths: list[str], fmt: str) -> bool:
    """Whether the parent may append through the ledger's load (``Recorder.load``): LOAD_BYTES
    of input or more, every file named once and none a ledger, as for a single replay."""
    found = [Path(path) for path in paths]
    return fmt != "ledger" and worth_loading(found) and len(files_read_once(found)) == len(found)


@contextlib.contextmanager
def _appender(ledger: Recorder, load: bool) -> Iterator[Callable[[GroupResult], GroupResult]]:
    """What appends each group's entries to ``ledger``, in one transaction per group (a
    single replay commits every few thousand rows too: one commit and one anchor move,
    not one per batch).

    With ``load``, through the ledger's load: into a new SQLite ledger, the rows are
    written by a process of their own and the id-key index is built once, at the end,
    instead of growing under random inserts group after group (2 GB of rollouts: 743 s
    → 22 s, and the parent's peak RSS no longer grows with the index pages each group's
    transaction dirtied: 1.37× that of 70 MB of them before). The observations go by
    ``append_new``: their ids name files read once, never offered again, so they are
    neither looked up nor kept. What the workers recorded themselves goes by ``append``,
    which keeps those ids, so one worker's record met again from another is dropped as
    the ledger would drop it."""
    with ledger.load() if load else contextlib.nullcontext(ledger) as target:
        def append(result: GroupResult) -> GroupResult:
            with target.bulk():
                for chunk in result.envelopes:
                    for observed, run in itertools.groupby(_envelopes.decode(chunk),
                                                           key=lambda env: is_file_source(env.source)):
                        (target.append_new if observed else target.append)(list(run))
            return result

        yield append


def _replay_file(path: str, fmt: str) -> ReplayFile:
    """What grouping needs of a file. One that cannot be read is a group of its own:
    its replay reports why, with the message a single replay gives."""
    try:
        st = os.stat(path)
        head = read_head(Path(path))
    except OSError:
        return ReplayFile(path, path, frozenset())
    named = fmt if fmt != "auto" else detect_format(head, path)
    return ReplayFile(path, f"{st.st_dev}:{st.st_ino}", file_threads(named, head, path))


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class _Meter:
    """Progress over all files (bytes done of bytes in total), from whichever worker
    reports: each file's latest count replaces its previous one."""

    def __init__(self, progress: Progress, total: int) -> None:
        self.progress = progress
        self.total = total
        self.done: dict[str, int] = {}
        self.sum = 0

    def __call__(self, path: str, done: int, _total: int) -> None:
        self.sum += done - self.done.get(path, 0)
        self.done[path] = done
        self.progress(path, self.sum, self.total)


# -- the pool ---------------------------------------------------------------------------

_worker: dict = {}  # in a worker: its settings and progress queue, set once at start


def _context(ledger: bool):
    """How workers start (see the module's docstring)."""
    import multiprocessing  # only for a pool: most replays are one group, in this process
    import multiprocessing.forkserver

    methods = multiprocessing.get_all_start_methods()
    if not ledger and "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload([__name__])  # workers forked with replay already imported
        # The server starts with SIGINT blocked (the mask is inherited), so a Ctrl-C
        # during its imports prints no traceback there, and the server then ignores it
        # for good. Blocked, not ignored, here: a Ctrl-C meanwhile waits and reaches this
        # process once the server stands (ignored, it was lost and the replay ran on).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return context


def _start_worker(settings: ReplaySettings, queue) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _worker.update(settings=settings, queue=queue)


def _work(paths: list[str]) -> GroupResult:
    queue = _worker["queue"]
    progress = (lambda path, done, total: queue.put((path, done, total))) if queue is not None else None
    return replay_group(_worker["settings"], paths, progress)


def _in_pool(settings: ReplaySettings, groups: list[list[str]], workers: int,
             meter: _Meter | None) -> Iterator[GroupResult]:
    """Each group's result, in group order. Without a ledger the largest groups are handed
    out first, so one long group started last does not leave the other workers idle at
    the end; into a ledger, groups go out in order, at most two per worker ahead of the
    parent's appends (their rows wait in the parent's memory)."""
    context = _context(ledger=settings.keep_entries)
    queue = context.Queue() if meter else None
    pool = _start_pool(context, workers, settings, queue)
    relay = threading.Thread(target=_relay, args=(queue, meter), daemon=True) if meter else None
    if relay:
        relay.start()
    try:
        with pool:  # leaving early (an error, Ctrl-C, the caller's error) terminates the workers
            if pool.interrupted:
                raise KeyboardInterrupt
            if settings.keep_entries:
                # Each result carries its group's rows until the parent appends them: a few
                # groups ahead of the parent, in group order, keep its memory flat.
                order, window = iter(range(len(groups))), 2 * workers
            else:
                order = iter(sorted(range(len(groups)), key=lambda g: -sum(map(_size, groups[g]))))
                window = len(groups)
            pending: dict[int, Any] = {}

            def hand_out() -> None:
                g = next(order, None)
                if g is not None:
                    pending[g] = pool.apply_async(_work, (groups[g],))

            for _ in range(window):
                hand_out()
            for g in range(len(groups)):
                result = pending.pop(g).get()  # a worker's error is raised here: the first in group order wins
                hand_out()
                yield result
            pool.close()
            pool.join()
    finally:
        if relay:
            queue.put(None)
            relay.join()


def _start_pool(context, workers: int, settings: ReplaySettings, queue):
    """The pool, with a Ctrl-C during its start held until it stands (``pool.interrupted``):
    interrupted half-way, it would leave workers starting after the parent is gone."""
    held: list[int] = []
    main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum)) if main else None
    try:
        pool = context.Pool(workers, initializer=_start_worker, initargs=(settings, queue))
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    pool.interrupted = bool(held)
    return pool


def _relay(queue, meter: _Meter) -> None:
    while (report := queue.get()) is not None:
        meter(*report)
