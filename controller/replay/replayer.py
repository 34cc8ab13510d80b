"""Offline replay: recorded sessions through the same normalizer, rules and policy as
the daemon, on a virtual clock.

Streaming: each file is read in chunks through its sans-IO parser, so memory stays
flat in file size. Time is the source's: before each event, every timer due up to
its timestamp fires (intent deadlines, rule thresholds) at exactly that virtual
time; formats without timestamps advance one second per record. Nothing is ever
dispatched: the intents the rules propose are marked ``replayed`` and the policy
never lets one reach a transport. The ordered decision stream is digested, so two
replays of the same input print the same ``decisions_digest``.

The decisions are the daemon's own: replay drives the same decision round
(``tillerman.controller.core.round``), adding the files and the virtual clock. The
pipeline, per event, does only what the event can change: it is folded (ahead of its
append, which waits for BATCH others: ``_fold_ahead``); its thread's rule triggers
are taken again from the small part of its state they read, with no snapshot
(``tillerman.controller.core.watches``); a full snapshot is built only where a
decision may be made: detection runs only where a rule can fire, the policy only for
that thread's open intents. The clock asks the timers
(``tillerman.controller.core.timers``) for the next due only when an event reaches their
horizon: a thread's due moving later, as its quiet timer does at nearly every event,
is not even pushed. What it records is row for row what an append and a rescan per
event recorded (tests/controller/test_replay_unchanged.py).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from tillerman.controller.core.overdue import overdue
from tillerman.controller.core.render import goal_json, overdue_json, trigger_counts
from tillerman.controller.core.round import Round
from tillerman.controller.core.supervisor import Step
from tillerman.ledger import events as ev
from tillerman.ledger.command_patterns import DEFAULT as DEFAULT_PATTERNS
from tillerman.ledger.command_patterns import CommandPatterns
from tillerman.ledger.errors import LedgerError
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.forgetting import ForgettingProjection
from tillerman.ledger.projections import is_open
from tillerman.ledger.recorder import Recorder
from tillerman.ledger.reviews import Call
from tillerman.monitor.counts import Counts, EventCounter
from tillerman.monitor.file_reader import FileReader, ForkedFileReader, ReaderDied
from tillerman.monitor.formats import PARSERS, detect_format, layout_note
from tillerman.monitor.identity import file_identity, read_first_line
from tillerman.monitor.tailer import file_source
from tillerman.rules.review import Reviewer
from tillerman.rules.ruleset import RuleSet

if TYPE_CHECKING:
    from tillerman.controller.review.checkpoints import Checkpoints

CHUNK = 1 << 20
HEAD = 64 * 1024
FORMATS = ("auto", *sorted(PARSERS), "ledger")
BATCH = 512  # observations folded ahead of their append, appended together
COMMIT_EVERY = 8192  # rows appended between commits, about: each costs a commit and an anchor move
PARSE_AHEAD_BYTES = 4 * CHUNK  # smaller files are parsed here: a process would cost more than it saves
LOAD_BYTES = 4 * CHUNK  # fewer bytes of input are written into a ledger here, for the same reason
UNTIMED_STEP = 1.0  # seconds of virtual time per record when a format has no clock
_SQLITE_MAGIC = b"SQLite format 3\x00"
GC_THRESHOLD = (50_000, 50, 100)  # collector thresholds while replaying (defaults: 700, 10, 10)
#: Formats whose file is one whole session: its threads end with it (a resumed Codex
#: session appends to its rollout), so once idle they are forgotten at the file's end.
ONE_SESSION_PER_FILE = frozenset({"codex-rollout", "codex-exec"})


class ReplayError(Exception):
    """Input that cannot be replayed (missing, unreadable, unknown format)."""

    exit_code = 2


class DamagedLedger(ReplayError):
    """A ledger whose chain does not verify: its history is not the recorded one."""

    exit_code = 1


class FileSummary(Counts, frozen=True, kw_only=True):
    """One file's counts (defined once, in ``tillerman.monitor.counts``) and where they came from."""

    path: str
    format: str
    records: int = 0
    unknown_types: dict[str, int] = {}


class ReplaySummary(msgspec.Struct, kw_only=True):
    files: list[FileSummary]
    events: int
    decisions: int
    decisions_digest: str
    reports: int
    intents: dict[str, int]
    overdue: list[dict]
    ruleset_digest: str
    ledger: str | None = None
    # Reviews by checkpoint and disposition (or fail-closed outcome; "held": a new checkpoint
    # not asked). Unset (and not shown) when no reviewer is configured.
    reviews: dict[str, dict[str, int]] | msgspec.UnsetType = msgspec.UNSET
    # Each thread that had a Codex goal: the goal as it ended and what started its recent
    # turns (``goal_summary``). Unset (and not shown) when no thread had one.
    goals: list[dict] | msgspec.UnsetType = msgspec.UNSET


Progress = Callable[[str, int, int], None]  # (path, bytes done, bytes total)


def goal_summary(projection: ForgettingProjection) -> list[dict] | msgspec.UnsetType:
    """Per thread that had a Codex goal: each status its goal changed to, the goal as
    the run left it, and how many of its recent turns each trigger started (user, goal,
    queue, unknown)."""
    found = projection.goal_threads()
    return [{"thread": thread_id, "goal_statuses": projection.goal_statuses(thread_id), "goal": goal_json(t.goal),
             "recent_turn_triggers": trigger_counts(t)} for thread_id, t in found.items()] or msgspec.UNSET


def collect_files(paths: list[str]) -> list[Path]:
    """Named files as given; directories searched recursively, in sorted order."""
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.is_file() and not p.is_symlink()
                                and p.suffix in (".jsonl", ".json", ".sqlite3", ".db")))
        elif path.is_file():
            found.append(path)
        else:
            raise ReplayError(f"{name}: {_not_a_file(path)}")
    if not found:
        raise ReplayError(f"no session files under {', '.join(paths)} (looked for *.jsonl)")
    return found


def _not_a_file(path: Path) -> str:
    """What a path that is neither a file nor a directory is, told from its ``stat``
    alone: opening a FIFO would block until a writer came."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "no such file or directory" + (" (a broken symbolic link)" if path.is_symlink() else "")
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"is {kind}, not a session file; replay reads regular files (*.jsonl, a ledger) and folders of them"


class Replayer:
    def __init__(
        self,
        recorder: Recorder,
        ruleset: RuleSet,
        *,
        fmt: str = "auto",
        patterns: CommandPatterns = DEFAULT_PATTERNS,
        retain_payloads: bool = False,
        progress: Progress | None = None,
        on_decision: Callable[[bytes], None] | None = None,
        reviewers: tuple[Reviewer, ...] = (),
        review: bool = False,
        parse_ahead: bool = False,
    ) -> None:
        if fmt not in FORMATS:
            raise ReplayError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        self.recorder = recorder
        self.ruleset = ruleset
        self.fmt = fmt
        self.patterns = patterns
        self.retain_payloads = retain_payloads
        self.progress = progress
        # Each decision's line of the digest, as it is hashed: a parallel replay
        # (``tillerman.controller.replay.parallel``) digests its groups' lines in order.
        self.on_decision = on_decision
        # Reviews (``tillerman.controller.review.checkpoints``): a recorded answer is used, a new
        # checkpoint is held (no call: deterministic) or, with ``review``, asked.
        self.checkpoints = _checkpoints(reviewers) if reviewers else None
        self.review = review
        # Large files read and parsed in a child process while this one folds
        # (``ForkedFileReader``, chosen in ``_replay_file``): a core no worker uses.
        self.parse_ahead = parse_ahead
        self._recorded_reviews: dict[str, list[Envelope]] = {}  # checkpoint id -> its records in the inputs
        self._held: list[str] = []
        # The daemon's decision round, on a fold that forgets what no later decision
        # reads (``_forget_settled``) and the virtual clock; nothing waits on a delivery.
        self.round = Round(ForgettingProjection(), Step(ruleset, replay=True), self._write,
                           reviews=self.checkpoints, followers=(self._account, self._forget_settled))
        self.projection = self.round.projection
        self.watches = self.round.watches
        self.timers = self.watches.timers
        # The open ``Recorder.bulk`` block, committed every COMMIT_EVERY rows or so (``_append``).
        self._bulk = contextlib.ExitStack()
        self._uncommitted = 0
        # Observations folded ahead of their append (``_fold_ahead``): appended together
        # when BATCH of them wait, or before anything of replay's own is appended.
        self._waiting: list[Envelope] = []
        self._next_seq: int | None = None  # the seq the next appended row gets, while it is certain
        self._identities: set[str] = set()  # the files replayed so far in this run
        # Files whose observations' ids an in-memory ledger need not keep (``_run``), and
        # whether the observations waiting to be appended are theirs.
        self._read_once: set[str] = set()
        self._waiting_read_once = False
        self.now: float | None = None
        self.end: float | None = None  # the latest virtual time any file reached
        self._digest = hashlib.sha256()
        self.decisions = 0
        self.reports = 0
        self.events = 0

    # -- driving ------------------------------------------------------------------

    def run(self, paths: list[str]) -> ReplaySummary:
        # Replay allocates a few short-lived containers per record and keeps little:
        # the collector's default gen-0 threshold (700) made it walk the young objects,
        # and every full pass the whole module graph, thousands of times per file.
        # Long-lived objects are frozen out of its sight, and it runs less often.
        thresholds = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLD)
        try:
            return self._run(paths)
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()

    def _run(self, paths: list[str]) -> ReplaySummary:
        found = collect_files(paths)
        files = []
        may_load = self._may_load(found)
        # The files named once, read only where they matter: an in-memory ledger keeps no
        # ids for their observations, and a load needs every file to be one.
        asked = self.fmt != "ledger" and (may_load or self.recorder.forgets_new_ids)
        read_once = files_read_once(found) if asked else set()
        with self._loading(may_load and len(read_once) == len(found)), self._bulk:
            self._bulk.enter_context(self.recorder.bulk())
            # Into an empty ledger, a file's observations cannot be duplicates (their ids
            # name the file, ``file_event_id``) unless the file was replayed before.
            self._next_seq = 1 if self.recorder.max_seq() == 0 else None
            if self.recorder.forgets_new_ids:
                self._read_once = read_once
            for path in found:
                files.append(self._replay_file(path))
            self._flush()
        now = self.end or 0.0
        return ReplaySummary(
            files=files,
            events=self.events,
            decisions=self.decisions,
            decisions_digest="sha256:" + self._digest.hexdigest(),
            reports=self.reports,
            intents=self.projection.intent_counts(),
            overdue=[overdue_json(o) for o in overdue(self.projection, now)],
            ruleset_digest=self.ruleset.digest,
            reviews=_review_counts(self.checkpoints, self._held) if self.checkpoints is not None else msgspec.UNSET,
            goals=goal_summary(self.projection),
        )

    def _may_load(self, found: list[Path]) -> bool:
        """Whether appends may go through the recorder's load (``Recorder.load``: into an
        empty SQLite ledger, rows written by a process of their own): with a core to
        spare (``parse_ahead``) and LOAD_BYTES of input or more; every file must also be
        named once (``_run``)."""
        return self.parse_ahead and worth_loading(found)

    @contextlib.contextmanager
    def _loading(self, load: bool) -> Iterator[None]:
        if not load:
            yield
            return
        recorder = self.recorder
        with recorder.load() as self.recorder:
            try:
                yield
            finally:
                self.recorder = recorder

    def _replay_file(self, path: Path) -> FileSummary:
        try:
            head = read_head(path)
        except OSError as exc:
            raise ReplayError(f"{path}: cannot read ({exc.strerror})") from exc
        fmt = self.fmt
        if not head:  # an empty file: nothing to read, nothing to count
            return FileSummary(path=str(path), format=fmt if fmt != "auto" else "empty")
        if fmt == "auto":
            fmt = "ledger" if head.startswith(_SQLITE_MAGIC) else detect_format(head, str(path))
            if fmt is None:
                why = layout_note(head) or f"cannot tell its format; give --format ({', '.join(FORMATS[1:])})"
                raise ReplayError(f"{path}: {why}")
        self.now = None  # each file runs on its own source clock
        if fmt == "ledger":
            return self._replay_ledger(path)
        source = file_source(path)
        parser = PARSERS[fmt](source=source, patterns=self.patterns, retain_payloads=self.retain_payloads)
        # A second copy of a file replayed in the same run repeats its event ids: the
        # ledger drops them (``append`` returns no entry), so they are not folded twice.
        identity = file_identity(path, read_first_line(path))
        ahead = self._next_seq is not None and identity not in self._identities
        self._identities.add(identity)
        read_once = ahead and identity in self._read_once
        if read_once != self._waiting_read_once:
            self._flush()  # one kind per append: ids kept, or not
            self._waiting_read_once = read_once
        total = path.stat().st_size
        forked = self.parse_ahead and total >= PARSE_AHEAD_BYTES and _may_fork()
        if forked:  # the ids made where there is time for them: in the child if the rows are chained here
            chained = not read_once or self.recorder.chains_new
            reader = ForkedFileReader(str(path), parser, identity, CHUNK, ids_in_child=chained)
        else:
            reader = FileReader(str(path), parser, identity, CHUNK)
        untimed, advance, take = parser.untimed, self._advance, self._take
        # While a forked child parses a file into a SQLite ledger, the ledger's log is
        # copied into its database on a thread of its own, on the core the parent's
        # commits leave free, not inside those commits (1M rollout lines: 35–37 → 33–34 s).
        # Started once the child is forked, and stopped when the file ends, before the
        # next fork: a thread alive at a fork would leave its locks held in the child.
        aside = forked
        try:
            for done, events in reader.chunks():
                if aside:
                    self.recorder.checkpoint_in_background()
                    aside = False
                for fe in events:
                    at = fe.at
                    if at is None and untimed:
                        at = (self.now or 0.0) + UNTIMED_STEP
                    now = advance(at)
                    # The envelope the live tailer (``file_envelope``) builds for this
                    # record, observed on the virtual clock.
                    take(Envelope(event_id=fe.event_id, event=fe.event, source=source, at=fe.at, observed_at=now,
                                  offset=fe.offset, length=fe.length), now, ahead=ahead)
                if self.progress:
                    self.progress(str(path), done, total)
        except OSError as exc:
            raise ReplayError(f"{path}: read failed ({exc.strerror})") from exc
        except ReaderDied as exc:
            raise ReplayError(str(exc)) from exc
        finally:
            self.recorder.checkpoint_in_commits()
        account = reader.account
        assert account is not None
        if fmt in ONE_SESSION_PER_FILE:
            self._forget_idle(account.threads)
        self.events += account.counts.events
        return FileSummary(path=str(path), format=fmt, records=account.records, unknown_types=account.unknown_types,
                           **msgspec.structs.asdict(account.counts))

    def _replay_ledger(self, path: Path) -> FileSummary:
        counter = EventCounter()
        records = 0
        if self.checkpoints is not None:
            for env in _review_records(path):
                self._recorded_reviews.setdefault(env.event.checkpoint_id, []).append(env)
        for env in _ledger_envelopes(path):  # its rows may be anywhere: appended one by one
            records += 1
            counter.add(env.event)
            now = self._advance(env.at)
            self._take(msgspec.structs.replace(env, observed_at=now), now, ahead=False)
        # A ledger holds the observations of the files it followed, under the ids a
        # replay of those files gives them: from here on, any row may be a duplicate.
        self._next_seq = None
        counts = counter.counts()
        self.events += counts.events
        return FileSummary(path=str(path), format="ledger", records=records, unknown_types={},
                           **msgspec.structs.asdict(counts))

    def _forget_idle(self, thread_ids: list[str]) -> None:
        """Memory stays flat over many files: a thread whose session ended is forgotten
        once nothing can happen on it (``tillerman.ledger.forgetting``)."""
        busy = {view.intent.thread_id for view in self.projection.open_intents()}
        for thread_id in thread_ids:
            if thread_id in busy:
                continue
            found = self.watches.fresh(thread_id)
            if not found.timers and not found.failures:
                self.projection.forget_thread(thread_id)
                self.watches.forget(thread_id)

    # -- one event on the virtual clock --------------------------------------------

    def _advance(self, at: float | None) -> float:
        """Move the virtual clock to an event's time, firing every timer due up to it
        first; the time the event is observed at."""
        if at is not None:
            if self.now is not None and at >= self.timers.horizon(self.now):
                self._fire_timers(until=at)
            self.now = at if self.now is None or at > self.now else self.now
        return self.now if self.now is not None else 0.0

    def _take(self, env: Envelope, now: float, *, ahead: bool) -> None:
        """Fold (and append) one observation, and decide what it can make decided."""
        if ahead:
            self._fold_ahead(env)
        else:
            self.round.record([env], self.now)
        thread = env.event.thread_id
        if thread is not None and self.round.may_decide(thread, now):
            self._decide([thread])
        if self.end is None or now > self.end:
            self.end = now

    def _fire_timers(self, until: float) -> None:
        """The virtual clock fires the rule and intent timers (``Round.timers_due``); a
        review's overdue-twice checkpoint is asked at the next event, not at its moment."""
        while self.now is not None:
            due = self.round.timers_due(self.now)
            if due is None or due > until:
                return
            self.now = due
            self._decide(list(self.projection.threads))

    def _decide(self, thread_ids: list[str]) -> None:
        """One round at the virtual time (before the source has told any: judged at 0,
        folded untimed). Nothing it decides is carried out: replay never dispatches."""
        decided = self.round.decide(thread_ids, self.now, answer=self._answer)
        self._held += [job.packet.checkpoint_id for job in decided.jobs]  # held: never asked, never dispatched

    def _answer(self, job) -> list[Envelope] | None:
        """A checkpoint's records now: the answer the inputs recorded (no call), the
        record of one settled without a call, or with ``review`` the reviewer asked in
        this thread; None: held."""
        from tillerman.controller.review.checkpoints import asked_now, without_call

        at = self.now if self.now is not None else 0.0
        if recorded := self._recorded_reviews.get(job.packet.checkpoint_id):
            return recorded
        if not isinstance(job.plan, Call):
            return [without_call(job, at)]
        if self.review:
            return asked_now(job, at, retain_payloads=self.retain_payloads)
        return None

    def _fold_ahead(self, env: Envelope) -> None:
        """Fold an observation the ledger is certain to store as the next row (it cannot
        be a duplicate: ``_run``), and append it later with others: one append per
        BATCH observations instead of one per event. Anything of replay's own is
        appended after the observations before it (``_write`` flushes first), so the
        rows and their order are those of an append per event."""
        waiting = self._waiting
        self.round.fold_ahead(env, self._next_seq + len(waiting), self.now)
        waiting.append(env)
        if len(waiting) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self._waiting:
            return
        waiting, self._waiting, first = self._waiting, [], self._next_seq
        entries = self._append(waiting, read_once=self._waiting_read_once, unseen=True)
        if len(entries) != len(waiting) or entries[0].seq != first:
            raise RuntimeError(f"the ledger stored {len(entries)} of {len(waiting)} observations folded ahead"
                               f" from seq {first}: the replay's fold no longer matches it")

    def _write(self, batch: list[Envelope]) -> tuple[Entry, ...]:
        """The round's append: after the observations folded ahead of it; the entries
        ``append`` returns are the rows to fold (nothing is read back)."""
        self._flush()
        return self._append(batch)

    def _append(self, batch: list[Envelope], *, read_once: bool = False, unseen: bool = False) -> tuple[Entry, ...]:
        """``read_once``: no id of the batch is ever offered again (``files_read_once``);
        ``unseen``: none is stored (observations folded ahead: ``_fold_ahead``)."""
        if not batch:
            return ()
        # What replay records itself is observed on the virtual clock too, not at the wall
        # time of the run: two replays of the same input write the same ledger.
        batch = [env if env.observed_at is not None else msgspec.structs.replace(env, observed_at=env.at)
                 for env in batch]
        if read_once:
            entries = self.recorder.append_new(batch).entries
        elif unseen:
            entries = self.recorder.append_unseen(batch).entries
        else:
            entries = self.recorder.append(batch).entries
        if entries and self._next_seq is not None:
            self._next_seq = entries[-1].seq + 1
        self._uncommitted += len(entries)
        if self._uncommitted >= COMMIT_EVERY:  # a commit now and then: a reader sees progress, a crash loses little
            self._uncommitted = 0
            self._bulk.close()
            self._bulk.enter_context(self.recorder.bulk())
        return entries

    def _forget_settled(self, entry: Entry) -> None:
        """An intent that settled is forgotten: no later step reads it
        (``tillerman.ledger.forgetting``)."""
        event = entry.envelope.event
        if isinstance(event, ev.IntentProposed | ev.IntentTransition):
            intent_id = event.intent.id if isinstance(event, ev.IntentProposed) else event.intent_id
            view = self.projection.intents.get(intent_id)
            if view is None or not is_open(view):
                self.projection.forget_intent(intent_id)

    def _account(self, entry: Entry) -> None:
        event = entry.envelope.event
        if isinstance(event, ev.DecisionRecorded):
            self.decisions += 1
            line = msgspec.json.encode(
                [event.intent_id, event.action, event.reason, event.rule_id, entry.envelope.at]) + b"\n"
            self._digest.update(line)
            if self.on_decision is not None:
                self.on_decision(line)
        elif isinstance(event, ev.Report):
            self.reports += 1


def _may_fork() -> bool:
    """Whether a child may be forked: a platform with ``fork`` and no other thread here
    (a thread holding a lock at the fork would leave it held in the child)."""
    return hasattr(os, "fork") and threading.active_count() == 1


def worth_loading(paths: list[Path]) -> bool:
    """Whether ``paths`` hold LOAD_BYTES of input or more, worth a load's writer process."""
    try:
        return sum(path.stat().st_size for path in paths) >= LOAD_BYTES
    except OSError:
        return False  # a file that vanished: its replay reports it


def files_read_once(paths: list[Path]) -> set[str]:
    """The identities of the files named once among ``paths``, when none is a ledger: the
    ids of their observations name them (``file_event_id``), so once a file is read
    nothing later in the run can offer them again, and an in-memory ledger need not
    keep them to drop duplicates. A file named twice repeats its ids; a ledger's rows
    repeat those of the files it followed: then every id is kept."""
    named: Counter[str] = Counter()
    for path in paths:
        try:
            if read_head(path).startswith(_SQLITE_MAGIC):
                return set()
            named[file_identity(path, read_first_line(path))] += 1
        except OSError:
            continue  # its replay reports it
    return {identity for identity, times in named.items() if times == 1}


def read_head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(HEAD)


_entry_decoder = msgspec.json.Decoder(Entry)


def _ledger_envelopes(path: Path) -> Iterator[Envelope]:
    """The observations of a tillerman ledger (a SQLite file, opened read-only, or a
    ``ledger export``): replay re-derives every decision from them, so tillerman's own
    rows are skipped. An observation row this version cannot decode is kept as
    quarantined input (its seq and size), and the replay goes on."""
    yield from _observations(path, _entries(path))


def _entries(path: Path) -> Iterator[Entry]:
    return _stored_entries(path) if read_head(path).startswith(_SQLITE_MAGIC) else _exported_entries(path)


def _review_records(path: Path) -> Iterator[Envelope]:
    """The review records of a ledger: what its reviewers answered, used instead of a call."""
    for entry in _entries(path):
        if isinstance(entry.envelope.event, ev.ReviewPending | ev.ReviewCommitted):
            yield entry.envelope


def _checkpoints(reviewers: tuple[Reviewer, ...]) -> Checkpoints:
    from tillerman.controller.review.checkpoints import Checkpoints  # reviews' machinery only with reviewers

    return Checkpoints(reviewers, replay=True)


def _review_counts(checkpoints: Checkpoints, held: list[str]) -> dict[str, dict[str, int]]:
    from tillerman.controller.review.checkpoints import review_counts

    return review_counts(checkpoints, held)


def _stored_entries(path: Path) -> Iterator[Entry]:
    from tillerman.ledger.sqlite import SQLiteRecorder  # SQLite only for a ledger given as input

    try:
        ledger: Recorder = SQLiteRecorder(path, readonly=True)
    except LedgerError as exc:
        raise ReplayError(f"{path}: not a readable tillerman ledger ({exc})") from exc
    with ledger:
        report = ledger.verify()
        if not report.ok:
            raise DamagedLedger(f"{path}: the ledger is damaged ({report.problems[0]}); a replay of it would not"
                                f" be the recorded history. `tillerman ledger verify --ledger {path}` says more")
        try:
            yield from ledger.history()  # its archive segments too, in seq order
        except LedgerError as exc:
            raise ReplayError(f"{path}: not a readable tillerman ledger ({exc})") from exc


def _exported_entries(path: Path) -> Iterator[Entry]:
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield _entry_decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise ReplayError(f"{path}:{number}: not a ledger export line ({exc})") from exc


def _observations(path: Path, entries: Iterator[Entry]) -> Iterator[Envelope]:
    wanted = ev.OBSERVATION_KINDS | {ev.Quarantined.__struct_config__.tag}
    for entry in entries:
        env = entry.envelope
        if isinstance(env.event, ev.Undecodable):
            if env.event.stored_kind in wanted:
                yield msgspec.structs.replace(env, event=_readable(env.event, path, entry.seq))
        elif ev.kind_of(env.event) in wanted:
            yield env


def _readable(event: ev.Undecodable, path: Path, seq: int) -> ev.Quarantined:
    return ev.Quarantined(thread_id=event.thread_id, turn_id=event.turn_id, source=str(path), offset=seq,
                          length=len(event.raw.encode()),
                          reason=f"undecodable ledger row seq {seq} ({event.stored_kind})")
