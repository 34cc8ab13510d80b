"""The usage account: every response's tokens counted once, per thread, turn, model and day,
and the second calculation beside the sum (docs/design.md "The usage account").

``UsageAccount.add`` folds one ``Usage`` envelope at a time, in ledger order, in O(1):

- **Counted once.** Claude Code entries are deduplicated by (``message_id``,
  ``request_id``) across every thread, as ccusage 20 does (``push_deduped_entry``): an
  entry without ``message_id`` is never deduplicated, and a sidechain entry also matches
  an entry of the same ``message_id`` alone (``/btw`` replays a parent message under a new
  request id). Of two duplicates the non-sidechain one wins, then the larger token
  total, then the one naming a speed (``should_replace_deduped_entry``); on a tie the
  first stays. A winner that replaces an earlier entry changes the totals by the
  difference, taken back where the earlier one was counted. Codex responses are
  deduplicated by ``response_key``: the live notification and the rollout record of one
  response count once. The account keeps every key; the budget fold, saved at every
  heartbeat, keeps ``KEPT_DAYS`` days of them (``Dedup.in_window``).
- **Two calculations.** A Codex response carries the thread's cumulative counter after it
  (``total``), so the counter before it is ``total - tokens``. Each response is linked to
  the one whose counter that is (or to the thread's start); a response nothing links to is
  a ``Mismatch``, with its place, field by field, and a cause where one can be named. The
  link is by counter, not by arrival, so a live stream and a rollout of the same thread,
  interleaved in any order, check the same; a predecessor arriving late resolves the
  finding. Claude Code's own cumulative figures (``UsageReported``: stream-json
  ``result`` or the transcript's ``cost-state``, per model) are compared with the
  transcript's sum per model. Totals are always the sum of responses; findings sit
  beside them, never folded in.

Pure: no I/O. The usage command and the budget rules read it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec

from tillerman.ledger.events import Envelope, Usage, UsageReported
from tillerman.ledger.id_table import key_of
from tillerman.ledger.usage import FIELDS, MAX_TOTAL_TOKENS, ZERO, Tokens

#: Causes a mismatch can name (docs/design.md "Counting rules", the two calculations).
BASELINE = "baseline"  # the first counter already above its response: a resumed or forked thread
GAP = "gap"  # the counter rose by more than the response: a line was lost
COUNTER_RESET = "counter_reset"  # the counter went down (or started again from zero)
PLACEHOLDER = "placeholder"  # Claude: the transcript's input below the CLI's own, the streaming placeholder
UNTRANSCRIBED = "untranscribed"  # Claude: a model the CLI reports that no transcript entry names

#: The vendor reports a Claude Code thread is compared against; others (Codex's
#: ``account/usage/read``) carry an estimate in dollars, not tokens to compare.
CLAUDE_REPORTS = ("claude_stream", "claude_cost_state")


class Place(msgspec.Struct, frozen=True, kw_only=True):
    """Where a response counts: its thread, turn, model (``-fast`` added for a fast
    response, as ccusage names it) and day (``YYYY-MM-DD`` in the account's time zone;
    None when the source gave no time)."""

    thread_id: str | None
    turn_id: str | None
    model: str | None
    day: str | None


class Counted(msgspec.Struct, frozen=True, kw_only=True):
    """What one ``add`` changed. ``delta`` is added at ``place``: the response's figures,
    or, when it replaces a duplicate counted at the same place, new minus old (fields may
    be negative). A duplicate counted elsewhere is taken back there instead:
    ``withdrawn`` names that place and ``withdrawn_tokens`` the figures subtracted."""

    place: Place
    delta: Tokens
    withdrawn: Place | None = None
    withdrawn_tokens: Tokens = ZERO


class Mismatch(msgspec.Struct, frozen=True, kw_only=True):
    """The two calculations disagree on one field.

    Codex: ``expected`` is what the counter should read after this response (the counter
    before it, as last seen on the thread, plus the response) and ``counter`` what it
    reads; ``difference = counter - expected``. ``source``/``offset`` locate the response,
    ``after``/``at_response`` are the event ids of the response before it on the thread
    (None for the first) and of this one. Claude: ``expected`` is the transcript's sum for
    ``model``, ``counter`` the CLI's own figure, located at the report."""

    thread_id: str | None
    field: str
    expected: int
    counter: int
    difference: int
    cause: str | None
    source: str
    offset: int | None = None
    after: str | None = None
    at_response: str | None = None
    model: str | None = None


P = TypeVar("P")

#: UTC days of responses the budget fold keeps keys for: the newest response's day and
#: the one before it (``Dedup.in_window``). A response two days older than the newest is
#: past its turn, its UTC day and the owner's UTC day; its keys are forgotten then, and a
#: report of it that late is charged to no budget (its thread's and goal's figures, which
#: never close, miss it: docs/usage/usage-and-budgets.md, "How long a copy is recognised").
KEPT_DAYS = 2


class Kept(msgspec.Struct, Generic[P], kw_only=True, array_like=True):
    """A counted Claude response: enough to withdraw it if a better duplicate arrives.
    ``place`` is wherever its reader counted it (the account's ``Place``, the budget
    fold's scopes)."""

    place: P
    tokens: Tokens
    sidechain: bool
    speed: str | None


class Withdrawal(msgspec.Struct, Generic[P], frozen=True):
    """What a winning duplicate takes back: the earlier copy's place and figures."""

    place: P
    tokens: Tokens


class Dedup(msgspec.Struct, Generic[P], kw_only=True):
    """Which reports of a response count, by ccusage 20's rules: the one rule the usage
    account and the budget fold (``tillerman.ledger.projections``) both follow. A
    msgspec Struct so the projection's snapshot keeps it; O(1) per response.

    Keys are 64-bit digests of the ids (``tillerman.ledger.id_table.key_of``; two ids of
    equal digest are one id, as there). ``by_request`` holds each kept Claude entry by
    the digest of (message id, request id); ``by_message`` the request keys of a message
    id's kept entries, in the order they were kept (the slot a winner takes over), for
    the sidechain lookup by message id alone.

    A reader that passes ``day`` (the budget fold) has its keys forgotten by age
    (``in_window``): ``days`` holds the newest UTC day (days since the epoch) a copy of
    each key was seen on, and ``by_day`` lists the keys each day saw, so a key is
    forgotten with the last day a copy of it came on (one response's copies can straddle
    midnight) and the state holds at most ``KEPT_DAYS`` days of responses however long it
    runs. The usage account passes none: it counts every file ever read, as ccusage does."""

    response_keys: set[int] = set()
    by_request: dict[int, Kept[P]] = {}
    by_message: dict[int, list[int]] = {}
    newest_day: int | None = None
    by_day: dict[int, list[tuple[int, int | None]]] = {}  # day -> (response or request key, message key)
    days: dict[int, int] = {}  # response or request key -> the newest day a copy of it was seen

    def in_window(self, day: int) -> bool:
        """Whether a response of UTC day ``day`` can still be charged: not more than
        ``KEPT_DAYS - 1`` days older than the newest one seen. A newer day moves the
        window and forgets the keys of the days it leaves."""
        newest = self.newest_day
        if newest is None or day > newest:
            self.newest_day = newest = day
            for old in [d for d in self.by_day if d <= day - KEPT_DAYS]:
                self._forget(old, self.by_day.pop(old))
        return day > newest - KEPT_DAYS

    def first_report(self, event: Usage, day: int | None = None) -> bool:
        """False for a second report of a response the source keyed (``response_key``:
        Codex's live notification and rollout record of one response); True otherwise."""
        if event.response_key is None:
            return True
        key = _digest(event.response_key)
        self._seen(day, key, None)
        if key in self.response_keys:
            return False
        self.response_keys.add(key)
        return True

    def admit(self, event: Usage, place: P, day: int | None = None) -> tuple[bool, Withdrawal[P] | None]:
        """Claude's (message id, request id) dedup for a response to be counted at
        ``place``: whether it counts, and the earlier duplicate it replaces, to be taken
        back where that was counted (None: counted for the first time, or not at all)."""
        if event.message_id is None:
            return True, None
        message = _digest(event.message_id)
        key = _digest(_request_key(event.message_id, event.request_id))
        entry = Kept(place=place, tokens=event.tokens, sidechain=event.sidechain, speed=event.speed)
        found = self._duplicate_of(message, key, entry)
        if found is None:
            self.by_request[key] = entry
            self.by_message.setdefault(message, []).append(key)
            self._seen(day, key, message)
            return True, None
        existing_key, existing = found
        if not _replaces(entry, existing):
            self._seen(day, existing_key, message)  # a copy on a later day keeps the key that long
            return False, None
        # The winner takes the loser's slot: its place among the entries of its message
        # id stays (as in ccusage), only the exact key moves to the winner's request id.
        del self.by_request[existing_key]
        slots = self.by_message[message]
        slots[slots.index(existing_key)] = key
        self.by_request[key] = entry
        later = self.days.pop(existing_key, None) if key != existing_key else None
        self._seen(day, key, message)
        if later is not None:  # the winner is kept as long as the copy it replaced would have been
            self._seen(later, key, message)
        return True, Withdrawal(existing.place, existing.tokens)

    def _duplicate_of(self, message: int, key: int, entry: Kept[P]) -> tuple[int, Kept[P]] | None:
        """ccusage's lookup: the exact (message id, request id) first, then, where either
        side is a sidechain entry, the first kept entry with the same message id."""
        exact = self.by_request.get(key)
        if exact is not None:
            return key, exact
        for slot in self.by_message.get(message, ()):
            kept = self.by_request[slot]
            if entry.sidechain or kept.sidechain:
                return slot, kept
        return None

    def _seen(self, day: int | None, key: int, message: int | None) -> None:
        """A copy of ``key`` came on ``day``: listed under it, unless a later day saw one."""
        if day is not None and self.days.get(key, day - 1) < day:
            self.days[key] = day
            self.by_day.setdefault(day, []).append((key, message))

    def _forget(self, day: int, seen: list[tuple[int, int | None]]) -> None:
        for key, message in seen:
            if self.days.get(key) != day:
                continue  # seen again on a later day (that day forgets it), or replaced
            del self.days[key]
            if message is None:
                self.response_keys.discard(key)
                continue
            slots = self.by_message.get(message)
            if slots is None or key not in slots:
                continue  # a winner took its slot
            del self.by_request[key]
            slots.remove(key)
            if not slots:
                del self.by_message[message]


def _digest(name: str) -> int:
    return int.from_bytes(key_of(name), "little")


def _request_key(message_id: str, request_id: str | None) -> str:
    # NUL cannot occur in either id as JSON text carries them, so the pair is unambiguous;
    # None (no request id) and "" stay apart.
    return f"{message_id}\x00{request_id}" if request_id is not None else message_id


@dataclass(slots=True)
class _Unlinked:
    """A Codex response whose counter-before no earlier response reached."""

    envelope: Envelope
    tokens: Tokens
    total: Tokens
    previous_counter: Tokens  # the thread's counter as last seen before it (ZERO: none)
    after: str | None
    first: bool


@dataclass(slots=True)
class _CounterChain:
    """One thread's cumulative counters, linked by ``counter before = total - response``."""

    seen: set[Tokens] = field(default_factory=set)
    unlinked: dict[Tokens, list[_Unlinked]] = field(default_factory=dict)
    started: bool = False  # a response already linked to the thread's start (counter 0)
    last_counter: Tokens = ZERO
    last_event: str | None = None

    def link(self, envelope: Envelope, tokens: Tokens, total: Tokens) -> None:
        before = total - tokens
        first = self.last_event is None
        at_start = before.is_zero()
        linked = before in self.seen or (at_start and not self.started)
        if at_start:
            self.started = True
        if not linked:
            self.unlinked.setdefault(before, []).append(_Unlinked(
                envelope, tokens, total, self.last_counter, self.last_event, first))
        self.seen.add(total)
        self.unlinked.pop(total, None)  # a late predecessor: those waiting for it are linked now
        self.last_counter, self.last_event = total, envelope.event_id

    def mismatches(self, thread_id: str | None) -> Iterator[Mismatch]:
        for waiting in self.unlinked.values():
            for unlinked in waiting:
                yield from _counter_mismatches(thread_id, unlinked)


def _counter_mismatches(thread_id: str | None, unlinked: _Unlinked) -> Iterator[Mismatch]:
    expected = unlinked.previous_counter + unlinked.tokens
    cause = _counter_cause(unlinked)
    for name in FIELDS:
        want, got = getattr(expected, name), getattr(unlinked.total, name)
        if want != got:
            yield Mismatch(thread_id=thread_id, field=name, expected=want, counter=got, difference=got - want,
                           cause=cause, source=unlinked.envelope.source, offset=unlinked.envelope.offset,
                           after=unlinked.after, at_response=unlinked.envelope.event_id)


def _counter_cause(unlinked: _Unlinked) -> str | None:
    expected = unlinked.previous_counter + unlinked.tokens
    if unlinked.total.total < unlinked.previous_counter.total or (
            (unlinked.total - unlinked.tokens).is_zero() and not unlinked.first):
        return COUNTER_RESET
    if unlinked.total.total > expected.total:
        return BASELINE if unlinked.first else GAP
    return None  # rose by less than the response, without going down: nothing to name


@dataclass(slots=True)
class ThreadUsage:
    """One thread's account. ``tokens`` is the sum of its responses; ``by_turn``,
    ``by_model`` and ``by_day`` split it; ``last_input`` is the latest response's input
    and ``context_window`` the latest window a source named, so ``context_use`` is how
    full the context was at the last response (``last_model`` names its model, for a
    source that names no window: Claude Code's transcripts)."""

    thread_id: str | None
    tokens: Tokens = ZERO
    responses: int = 0
    by_turn: dict[str | None, Tokens] = field(default_factory=dict)
    by_model: dict[str | None, Tokens] = field(default_factory=dict)
    by_day: dict[str | None, Tokens] = field(default_factory=dict)
    last_input: int | None = None
    last_model: str | None = None
    context_window: int | None = None
    first_at: float | None = None
    last_at: float | None = None
    reported: dict[str, Envelope] = field(default_factory=dict)  # the latest UsageReported per source kind
    counters: _CounterChain = field(default_factory=_CounterChain)

    @property
    def context_use(self) -> float | None:
        if self.last_input is None or not self.context_window:
            return None
        return self.last_input / self.context_window

    @property
    def out_of_range(self) -> tuple[str, ...]:
        return out_of_range(self.tokens)

    def _change(self, place: Place, delta: Tokens, responses: int) -> None:
        # The three splits written out, not looped over: this runs for every response.
        self.tokens += delta
        self.responses += responses
        by_turn, by_model, by_day = self.by_turn, self.by_model, self.by_day
        by_turn[place.turn_id] = by_turn.get(place.turn_id, ZERO) + delta
        by_model[place.model] = by_model.get(place.model, ZERO) + delta
        by_day[place.day] = by_day.get(place.day, ZERO) + delta

    def _seen_at(self, at: float | None) -> None:
        if at is None:
            return
        # compared, not min()/max(): this runs for every response
        if self.first_at is None or at < self.first_at:
            self.first_at = at
        if self.last_at is None or at > self.last_at:
            self.last_at = at


def out_of_range(tokens: Tokens) -> tuple[str, ...]:
    """The figures (and ``total``) of a sum past ``MAX_TOTAL_TOKENS``: forged or corrupt
    input added up, to be reported as out of range, never printed as a number."""
    names = tuple(name for name in FIELDS if getattr(tokens, name) > MAX_TOTAL_TOKENS)
    return names + ("total",) if tokens.total > MAX_TOTAL_TOKENS else names


class UsageAccount:
    """The account of every ``Usage`` and ``UsageReported`` envelope given to ``add``."""

    def __init__(self, tz: dt.tzinfo | None = dt.timezone.utc) -> None:
        self.tz = tz  # the days' time zone; None: the system's, as ccusage defaults
        self.threads: dict[str | None, ThreadUsage] = {}
        self.tokens: Tokens = ZERO
        self._dedup: Dedup[Place] = Dedup()

    def add(self, envelope: Envelope) -> Counted | None:
        """Fold one envelope. Returns what it changed, or None: a duplicate that lost, or
        an event that is not a response's usage (a ``UsageReported`` is kept beside the
        account, never added to it)."""
        event = envelope.event
        if isinstance(event, UsageReported):
            self.thread(event.thread_id).reported[event.source_kind] = envelope
            return None
        if not isinstance(event, Usage):
            return None
        if not self._dedup.first_report(event):
            return None
        thread = self.thread(event.thread_id)
        if event.total is not None:
            thread.counters.link(envelope, event.tokens, event.total)
        place = self._place(envelope, event)
        counts, replaced = self._dedup.admit(event, place)
        if not counts:
            return None
        self._latest(thread, event, envelope.at)
        if replaced is None:
            self.tokens += event.tokens
            thread._change(place, event.tokens, 1)
            return Counted(place=place, delta=event.tokens)
        self.tokens += event.tokens - replaced.tokens
        if replaced.place == place:
            thread._change(place, event.tokens - replaced.tokens, 0)
            return Counted(place=place, delta=event.tokens - replaced.tokens)
        self.thread(replaced.place.thread_id)._change(replaced.place, ZERO - replaced.tokens, -1)
        thread._change(place, event.tokens, 1)
        return Counted(place=place, delta=event.tokens, withdrawn=replaced.place, withdrawn_tokens=replaced.tokens)

    def thread(self, thread_id: str | None) -> ThreadUsage:
        found = self.threads.get(thread_id)
        if found is None:
            found = self.threads[thread_id] = ThreadUsage(thread_id)
        return found

    def mismatches(self) -> Iterator[Mismatch]:
        """Where the two calculations disagree, thread by thread."""
        for thread_id, thread in self.threads.items():
            yield from thread.counters.mismatches(thread_id)
            yield from _reported_mismatches(thread)

    def add_all(self, envelopes: Iterable[Envelope]) -> UsageAccount:
        for envelope in envelopes:
            self.add(envelope)
        return self

    def _place(self, envelope: Envelope, event: Usage) -> Place:
        model = event.model
        if model is not None and event.speed == "fast":
            model = f"{model}-fast"
        day = None if envelope.at is None else dt.datetime.fromtimestamp(envelope.at, self.tz).date().isoformat()
        return Place(thread_id=event.thread_id, turn_id=event.turn_id, model=model, day=day)

    @staticmethod
    def _latest(thread: ThreadUsage, event: Usage, at: float | None) -> None:
        thread._seen_at(at)
        thread.last_input, thread.last_model = event.tokens.input, event.model
        if event.context_window is not None:
            thread.context_window = event.context_window


def _replaces(candidate: Kept, existing: Kept) -> bool:
    """ccusage's ``should_replace_deduped_entry``: non-sidechain, then the larger total
    (input, cache included, plus output), then the one naming a speed; else the first stays."""
    if candidate.sidechain != existing.sidechain:
        return existing.sidechain
    if candidate.tokens.total != existing.tokens.total:
        return candidate.tokens.total > existing.tokens.total
    return candidate.speed is not None and existing.speed is None


def _reported_mismatches(thread: ThreadUsage) -> Iterator[Mismatch]:
    """A Claude Code thread's transcript sum against the CLI's own figures, per model."""
    for kind in CLAUDE_REPORTS:
        envelope = thread.reported.get(kind)
        if envelope is None:
            continue
        assert isinstance(envelope.event, UsageReported)
        for reported in envelope.event.models:
            ours = thread.by_model.get(reported.model)
            for name in FIELDS:
                want = 0 if ours is None else getattr(ours, name)
                got = getattr(reported.tokens, name)
                if want == got:
                    continue
                cause = UNTRANSCRIBED if ours is None else PLACEHOLDER if name == "input" and want < got else None
                yield Mismatch(thread_id=thread.thread_id, field=name, expected=want, counter=got,
                               difference=got - want, cause=cause, source=envelope.source, offset=envelope.offset,
                               at_response=envelope.event_id, model=reported.model)
