"""Offline replay: recorded sessions through the same normalizer, rules and policy as
the daemon, on a virtual clock.

Streaming: each file is read in chunks through its sans-IO parser, so memory stays
flat in file size. Time is the source's: before each event, every timer due up to
its timestamp fires (intent deadlines, rule thresholds) at exactly that virtual
time; formats without timestamps advance one second per record. Nothing is ever
dispatched: the intents the rules propose are marked ``replayed`` and the policy
never lets one reach a transport. The ordered decision stream is digested, so two
replays of the same input print the same ``decisions_digest``.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec

from controller.overdue import overdue
from controller.render import overdue_json
from controller.supervisor import Step
from ledger import events as ev
from ledger.events import Entry, Envelope
from ledger.projections import Projection
from ledger.recorder import Recorder
from monitor.commands import DEFAULT as DEFAULT_PATTERNS
from monitor.commands import CommandPatterns
from monitor.counts import Counts, EventCounter
from monitor.formats import PARSERS, detect_format
from monitor.identity import file_event_id, file_identity, read_first_line
from monitor.parser import Parsed
from rules.detect import next_due
from rules.ruleset import RuleSet

CHUNK = 1 << 20
HEAD = 64 * 1024
FORMATS = ("auto", *sorted(PARSERS), "ledger")
UNTIMED_STEP = 1.0  # seconds of virtual time per record when a format has no clock
_SQLITE_MAGIC = b"SQLite format 3\x00"


class ReplayError(Exception):
    """Input that cannot be replayed (missing, unreadable, unknown format)."""


class FileSummary(Counts, frozen=True, kw_only=True):
    """One file's counts (defined once, in ``monitor.counts``) and where they came from."""

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


Progress = Callable[[str, int, int], None]  # (path, bytes done, bytes total)


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
            raise ReplayError(f"{name}: no such file or directory")
    if not found:
        raise ReplayError(f"no session files under {', '.join(paths)} (looked for *.jsonl)")
    return found


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
    ) -> None:
        if fmt not in FORMATS:
            raise ReplayError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        self.recorder = recorder
        self.ruleset = ruleset
        self.fmt = fmt
        self.patterns = patterns
        self.retain_payloads = retain_payloads
        self.progress = progress
        self.step = Step(ruleset, replay=True)
        self.projection = Projection()
        self.now: float | None = None
        self.end: float | None = None  # the latest virtual time any file reached
        self._digest = hashlib.sha256()
        self.decisions = 0
        self.reports = 0
        self.events = 0

    # -- driving ------------------------------------------------------------------

    def run(self, paths: list[str]) -> ReplaySummary:
        files = [self._replay_file(path) for path in collect_files(paths)]
        now = self.end or 0.0
        return ReplaySummary(
            files=files,
            events=self.events,
            decisions=self.decisions,
            decisions_digest="sha256:" + self._digest.hexdigest(),
            reports=self.reports,
            intents=dict(sorted(Counter(v.state for v in self.projection.intents.values()).items())),
            overdue=[overdue_json(o) for o in overdue(self.projection, now)],
            ruleset_digest=self.ruleset.digest,
        )

    def _replay_file(self, path: Path) -> FileSummary:
        try:
            head = _read_head(path)
        except OSError as exc:
            raise ReplayError(f"{path}: cannot read ({exc.strerror})") from exc
        fmt = self.fmt
        if not head:  # an empty file: nothing to read, nothing to count
            return FileSummary(path=str(path), format=fmt if fmt != "auto" else "empty")
        if fmt == "auto":
            fmt = "ledger" if head.startswith(_SQLITE_MAGIC) else detect_format(head, str(path))
            if fmt is None:
                raise ReplayError(f"{path}: cannot tell its format; give --format ({', '.join(FORMATS[1:])})")
        self.now = None  # each file runs on its own source clock
        counter = EventCounter()
        if fmt == "ledger":
            records, unknown = 0, {}
            for env in _ledger_envelopes(path):
                records += 1
                counter.add(env.event)
                self._observe(env, env.at)
        else:
            parser = PARSERS[fmt](source=f"file:{path}", patterns=self.patterns, retain_payloads=self.retain_payloads)
            identity = file_identity(path, read_first_line(path))
            for parsed in self._parse(path, parser):
                counter.add(parsed.event)
                at = parsed.at
                if at is None and parser.untimed:
                    at = (self.now or 0.0) + UNTIMED_STEP
                self._observe(Envelope(
                    event_id=file_event_id(identity, parsed.offset, parsed.index), event=parsed.event,
                    source=f"file:{path}", at=parsed.at, offset=parsed.offset, length=parsed.length,
                ), at)
            records, unknown = parser.records, dict(sorted(parser.unknown_types.items()))
        return FileSummary(path=str(path), format=fmt, records=records, unknown_types=unknown,
                           **msgspec.structs.asdict(counter.counts()))

    def _parse(self, path: Path, parser) -> Iterator[Parsed]:
        total, done = path.stat().st_size, 0
        try:
            with open(path, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    yield from parser.feed(chunk)
                    done += len(chunk)
                    if self.progress:
                        self.progress(str(path), done, total)
        except OSError as exc:
            raise ReplayError(f"{path}: read failed ({exc.strerror})") from exc
        yield from parser.close()

    # -- one event on the virtual clock --------------------------------------------

    def _observe(self, env: Envelope, at: float | None) -> None:
        if at is not None:
            self._fire_timers(until=at)
            self.now = at if self.now is None else max(self.now, at)
        now = self.now if self.now is not None else 0.0
        env = msgspec.structs.replace(env, observed_at=now)
        self.events += not isinstance(env.event, ev.Quarantined)
        self._record([env])
        thread = env.event.thread_id
        if thread is not None:
            self._evaluate([thread], now)
        self.end = now if self.end is None else max(self.end, now)

    def _fire_timers(self, until: float) -> None:
        while self.now is not None:
            due = self._next_due(self.now)
            if due is None or due > until:
                return
            self.now = due
            self._evaluate(list(self.projection.threads), due)

    def _next_due(self, now: float) -> float | None:
        candidates = []
        for view in self.projection.open_intents():
            i = view.intent
            candidates.extend(t for t in (i.ack_deadline, i.effect_deadline, i.expires_at) if t is not None and t > now)
        for thread_id in self.projection.threads:
            due = next_due(self.projection.snapshot(thread_id), now, self.ruleset)
            if due is not None and due > now:
                candidates.append(due)
        return min(candidates, default=None)

    def _evaluate(self, thread_ids: list[str], now: float) -> None:
        self._record(self.step.step(self.projection, thread_ids, now))
        wanted = set(thread_ids)
        views = [v for v in self.projection.open_intents() if v.intent.thread_id in wanted]
        self._record(self.step.decide_intents(self.projection, views, now)[0])

    def _record(self, batch: list[Envelope]) -> None:
        if not batch:
            return
        self.recorder.append(batch)
        for entry in self.recorder.read(after_seq=self.projection.seq):
            self._account(entry)
            self.projection.apply(entry)

    def _account(self, entry: Entry) -> None:
        event = entry.envelope.event
        if isinstance(event, ev.DecisionRecorded):
            self.decisions += 1
            self._digest.update(msgspec.json.encode(
                [event.intent_id, event.action, event.reason, event.rule_id, entry.envelope.at]))
            self._digest.update(b"\n")
        elif isinstance(event, ev.Report):
            self.reports += 1


def _read_head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(HEAD)


_entry_decoder = msgspec.json.Decoder(Entry)


def _ledger_envelopes(path: Path) -> Iterator[Envelope]:
    """The observations of a tillerman ledger (a SQLite file, read-only, or a
    ``ledger export``): replay re-derives every decision from them."""
    if _read_head(path).startswith(_SQLITE_MAGIC):
        try:
            db = sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True)
            rows = db.execute("SELECT event_id, at, observed_at, source, offset, length, payload FROM events ORDER BY seq")
            for event_id, at, observed_at, source, offset, length, payload in rows:
                event = ev.decode(payload)
                if ev.kind_of(event) in ev.OBSERVATION_KINDS or isinstance(event, ev.Quarantined):
                    yield Envelope(event_id=event_id, event=event, source=source, at=at,
                                   observed_at=observed_at, offset=offset, length=length)
        except (sqlite3.Error, msgspec.DecodeError) as exc:
            raise ReplayError(f"{path}: not a readable tillerman ledger ({exc})") from exc
        return
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                env = _entry_decoder.decode(line).envelope
            except msgspec.DecodeError as exc:
                raise ReplayError(f"{path}:{number}: not a ledger export line ({exc})") from exc
            if ev.kind_of(env.event) in ev.OBSERVATION_KINDS or isinstance(env.event, ev.Quarantined):
                yield env
