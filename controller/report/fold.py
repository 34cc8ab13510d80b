"""The facts an account and a timeline are made of, folded from ledger entries.

``Facts.apply`` is called once per entry in seq order and does no I/O, like
``tillerman.ledger.projections``; it reuses that fold for the intents (their records,
states and journeys) and ``tillerman.ledger.reviews`` for the reviewer's calls, and
adds what neither keeps: every turn with its start and end, every tool call with its
run time, approval waits, queue entries, the reports made for a person, the decisions,
the echoes of our own messages (to count deliveries), the owner's labels
(``tillerman.ledger.labels``), each change of a thread's Codex
goal and what started each turn (``Turn.trigger``: read from a rollout, or inferred by
the ledger's fold), and where the ledger's time ends. Usage goes through the usage
report (``tillerman.controller.report.usage``), priced with the table given, so
the account can say what the turns it names spent.
"""

from __future__ import annotations

import datetime as dt
import re

import msgspec

from tillerman.controller.report.usage import Figures, UsageReport
from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry
from tillerman.ledger.intents import client_id_to_intent_id
from tillerman.ledger.labels import Labels
from tillerman.ledger.projections import Projection
from tillerman.ledger.reviews import Reviews
from tillerman.rules.prices import PriceTable, bundled_table

#: The finding ``tillerman.rules.detect`` writes for a ``turn_quiet`` condition: a stall.
STALL_FINDING = re.compile(r"^turn (?P<turn>\S+) made no progress")
#: Item types that are messages, not tool calls.
MESSAGE_ITEMS = frozenset({"userMessage", "agentMessage", "reasoning", "user_message", "agent_message"})


#: 2000-01-01T00:00:00Z: an earlier observation time is replay's virtual clock, not a date.
EARLIEST_REAL_TIME = 946684800.0


class Turn(msgspec.Struct, kw_only=True):
    thread_id: str
    turn_id: str
    started_at: float | None = None
    ended_at: float | None = None
    status: str | None = None  # None: still open when the ledger ends
    duration_ms: int | None = None
    seq: int = 0  # where it started (or, with no start recorded, ended)
    ended_seq: int = 0
    # What started it ("user", "goal", "queue", "unknown"), as the fold knew it when the
    # turn ended (an inference is settled by then); None: not known (``Facts.trigger``).
    trigger: str | None = None
    trigger_inferred: bool = False

    @property
    def seconds(self) -> float | None:
        if self.duration_ms is not None:
            return self.duration_ms / 1000
        if self.started_at is not None and self.ended_at is not None:
            return max(0.0, self.ended_at - self.started_at)
        return None


class ToolCall(msgspec.Struct, kw_only=True):
    thread_id: str
    turn_id: str | None
    item_id: str
    item_type: str
    tool: str | None = None
    command: str | None = None  # a shell call's command line: only with --retain-payloads
    critical: bool = False
    started_at: float | None = None
    ended_at: float | None = None
    status: str | None = None  # None: no completion recorded
    exit_code: int | None = None
    seq: int = 0
    ended_seq: int | None = None


class Said(msgspec.Struct, kw_only=True):
    """An agent message whose text was retained (``--retain-payloads``)."""

    thread_id: str
    turn_id: str | None
    at: float | None
    seq: int
    text: str


class Span(msgspec.Struct, kw_only=True):
    """An approval wait or a queue entry: something that waited from ``start`` to ``end``."""

    kind: str  # "approval" | "queue"
    thread_id: str
    turn_id: str | None
    key: str
    start: float | None
    end: float | None = None
    detail: str = ""


class PersonReport(msgspec.Struct, kw_only=True):
    """A ``report`` event: a finding for a person (``shadow`` ones are not sent to anyone)."""

    seq: int
    at: float | None
    thread_id: str | None
    turn_id: str | None
    rule_id: str
    finding: str
    action: str | None
    shadow: bool
    intent_id: str | None
    event_id: str  # what a label of the finding names (``finding:EVENT_ID``)


class BudgetCrossing(msgspec.Struct, kw_only=True):
    """A budget rule's report (``tillerman.rules.detect``: its detail names the usage row
    that crossed): the figure, its limit and scope, and the intent proposed with it."""

    seq: int
    at: float | None
    rule_id: str
    thread_id: str | None
    turn_id: str | None
    measure: str | None
    figure: float | None
    limit: float | None
    per: str | None
    instance: str | None
    source_kind: str | None
    usage_seq: int | None
    price_date: str | None
    unpriced_models: str | None
    action: str | None
    shadow: bool
    intent_id: str | None  # the intent proposed beside it (a shadow rule's: the one it would have been)
    # where that intent's journey ended (``tillerman.controller.report.account`` fills
    # them in: an intent's state moves on after the report)
    intent_state: str | None = None
    intent_reason: str | None = None


class Decision(msgspec.Struct, kw_only=True):
    seq: int
    at: float | None
    thread_id: str | None
    intent_id: str
    action: str
    reason: str
    rule_id: str | None
    shadow: bool


class GoalChange(msgspec.Struct, kw_only=True):
    """A thread's Codex goal moved to another status (``cleared`` for a clear)."""

    seq: int
    at: float | None
    thread_id: str
    status: str
    by: str | None = None  # "tillerman" when our own request changed it
    token_budget: int | None = None
    tokens_used: int | None = None
    turn_id: str | None = None  # the turn whose end the change came with


class Progress(msgspec.Struct, kw_only=True):
    """The first sign of life in a turn after ``after``: the agent's, not our own message."""

    at: float | None
    seq: int


class Facts:
    def __init__(self, prices: PriceTable | None = None) -> None:
        self.projection = Projection()
        self.reviews = Reviews()
        self.labels = Labels()
        # each turn's tokens and cost, counted once; days in UTC, as the report's times
        self.usage = UsageReport(prices or bundled_table(), by="turn", tz=dt.timezone.utc)
        self.turns: dict[tuple[str, str], Turn] = {}
        self.calls: dict[tuple[str, str], ToolCall] = {}
        self.said: list[Said] = []  # in seq order; empty unless payloads were retained
        self.spans: dict[tuple[str, str, str], Span] = {}
        self.reports: list[PersonReport] = []
        self.budget_crossings: list[BudgetCrossing] = []
        self.decisions: list[Decision] = []
        self.goal_changes: list[GoalChange] = []
        self._goal_status: dict[str, str] = {}  # thread -> its goal's status at its last change
        # intent id -> the (turn, item) of each echo of its message: more than one is a duplicate
        self.echoes: dict[str, set[tuple[str | None, str | None]]] = {}
        # (thread, turn) -> (at, seq) of each agent event in it, for how stalls ended
        self.activity: dict[tuple[str, str], list[tuple[float | None, int]]] = {}
        self.events = 0
        self.kinds: dict[str, int] = {}
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.undecodable = 0

    def fold(self, entries) -> Facts:
        for entry in entries:
            self.apply(entry)
        return self

    def apply(self, entry: Entry) -> None:
        env = entry.envelope
        event = env.event
        # A record without its own time has only the observer's, and replay's virtual
        # clock counts from 0 until a record of the group gives it a real time: such an
        # observation time is unknown, not 1970 (a record's own time is taken as given).
        at = env.at
        if at is None and env.observed_at is not None and env.observed_at >= EARLIEST_REAL_TIME:
            at = env.observed_at
        linked = self._ids_of_linked_turns(event) if isinstance(event, ev.TurnAlias) else ()
        self.projection.apply(entry)
        for turn_id in linked:
            self._relink(event.thread_id, turn_id)
        self.reviews.apply(entry)
        self.labels.apply(entry)
        self.events += 1
        kind = ev.kind_of(event)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if at is not None:
            self.first_at = at if self.first_at is None else min(self.first_at, at)
            self.last_at = at if self.last_at is None else max(self.last_at, at)
        step = _STEPS.get(type(event))
        if step is not None:
            step(self, event, at, entry.seq)
        elif isinstance(event, ev.Report):  # the one step that needs the event's id: a label names it
            self._report(event, at, entry.seq, env.event_id)
        if isinstance(event, ev.Usage | ev.UsageReported):
            self.usage.add(env)

    # -- per kind ---------------------------------------------------------------

    def _turn_id(self, e: ev.Event) -> str | None:
        """The id the ledger's fold knows ``e``'s turn by: one turn however many sources
        named it (a Claude Code transcript's uuid and its hooks' ``prompt_id``)."""
        thread = self.projection.threads.get(e.thread_id) if e.thread_id is not None else None
        return thread.canonical_turn(e.turn_id) if thread is not None else e.turn_id

    def _ids_of_linked_turns(self, e: ev.TurnAlias) -> tuple[str | None, str | None]:
        """The ids the two turns a link ties were kept by until now."""
        return self._turn_id(e), self._turn_id(msgspec.structs.replace(e, turn_id=e.alias))

    def _relink(self, thread_id: str | None, old: str | None) -> None:
        """A link that came after both its turns started (``tillerman claude`` reads it
        from the transcript, written after the turn opened on stdout): what was kept
        under the id the fold no longer knows the turn by moves to the one it does, so
        the turn, its calls, waits, activity and echoes are counted once."""
        thread = self.projection.threads.get(thread_id) if thread_id is not None else None
        new = thread.canonical_turn(old) if thread is not None else old
        if thread_id is None or old is None or new is None or new == old:
            return
        gone = self.turns.pop((thread_id, old), None)
        if gone is None:
            return
        self.turns[(thread_id, new)] = _one_turn(self.turns.get((thread_id, new)), gone, new)
        moved = self.activity.pop((thread_id, old), [])
        if moved:
            self.activity[(thread_id, new)] = sorted(self.activity.get((thread_id, new), []) + moved,
                                                     key=lambda progress: progress[1])
        for call in reversed(self.calls.values()):  # in seq order: none before the turn began
            if call.seq < gone.seq:
                break
            if call.thread_id == thread_id and call.turn_id == old:
                call.turn_id = new
        for span in self.spans.values():
            if span.thread_id == thread_id and span.turn_id == old:
                span.turn_id = new
        for intent_id, echoes in self.echoes.items():
            if any(turn == old for turn, _ in echoes):
                self.echoes[intent_id] = {(new if turn == old else turn, item) for turn, item in echoes}

    def _turn(self, e: ev.Event) -> Turn | None:
        turn_id = self._turn_id(e)
        if e.thread_id is None or turn_id is None:
            return None
        key = (e.thread_id, turn_id)
        turn = self.turns.get(key)
        if turn is None:
            turn = self.turns[key] = Turn(thread_id=e.thread_id, turn_id=turn_id)
        return turn

    def _turn_started(self, e: ev.TurnStarted, at, seq) -> None:
        turn = self._turn(e)
        if turn is not None and turn.started_at is None:  # a second source's copy is the same turn
            turn.started_at, turn.seq = at, seq

    def _turn_completed(self, e: ev.TurnCompleted, at, seq) -> None:
        turn = self._turn(e)
        if turn is None or turn.status is not None:
            return
        turn.status, turn.ended_at, turn.duration_ms, turn.ended_seq = e.status, at, e.duration_ms, seq
        turn.trigger, turn.trigger_inferred = self.trigger(turn)
        if not turn.seq:
            turn.seq = seq
        for span in self.spans.values():  # the server resolves what waited in the turn
            if span.kind == "approval" and span.thread_id == e.thread_id and span.turn_id == turn.turn_id \
                    and span.end is None:
                span.end = at

    def _item_started(self, e: ev.ItemStarted, at, seq) -> None:
        self._active(e, at, seq)
        if e.thread_id is None or e.item_type in MESSAGE_ITEMS:
            return
        key = (e.thread_id, e.item_id)
        if key not in self.calls:
            self.calls[key] = ToolCall(thread_id=e.thread_id, turn_id=self._turn_id(e), item_id=e.item_id,
                                       item_type=e.item_type, tool=e.tool, command=e.command or None,
                                       critical=e.critical, started_at=at, seq=seq)

    def _item_completed(self, e: ev.ItemCompleted, at, seq) -> None:
        self._active(e, at, seq)
        if e.thread_id is None or e.item_type in MESSAGE_ITEMS:
            return
        call = self.calls.get((e.thread_id, e.item_id))
        if call is None:  # a format that records only the end
            call = self.calls[(e.thread_id, e.item_id)] = ToolCall(
                thread_id=e.thread_id, turn_id=self._turn_id(e), item_id=e.item_id, item_type=e.item_type,
                tool=e.tool, critical=e.critical, seq=seq)
        if call.status is None:
            call.status, call.ended_at, call.exit_code, call.ended_seq = e.status, at, e.exit_code, seq
            call.critical = call.critical or e.critical
            call.tool = call.tool or e.tool
        span = self.spans.get(("approval", e.thread_id, e.item_id))
        if span is not None and span.end is None:
            span.end = at

    def _active(self, e: ev.Event, at, seq) -> None:
        if e.thread_id is not None and e.turn_id is not None:
            self.activity.setdefault((e.thread_id, self._turn_id(e)), []).append((at, seq))

    def _agent_message(self, e: ev.AgentMessage, at, seq) -> None:
        self._active(e, at, seq)
        if e.thread_id is not None and e.text is not None:
            self.said.append(Said(thread_id=e.thread_id, turn_id=self._turn_id(e), at=at, seq=seq, text=e.text))

    def _user_message(self, e: ev.UserMessage, at, seq) -> None:
        intent_id = client_id_to_intent_id(e.client_id)
        if intent_id is not None:
            self.echoes.setdefault(intent_id, set()).add((self._turn_id(e), e.item_id))

    def _approval_requested(self, e: ev.ApprovalRequested, at, seq) -> None:
        if e.thread_id is not None:
            self.spans.setdefault(("approval", e.thread_id, e.item_id), Span(
                kind="approval", thread_id=e.thread_id, turn_id=self._turn_id(e), key=e.item_id, start=at,
                detail=e.approval_kind))

    def _approval_resolved(self, e: ev.ApprovalResolved, at, seq) -> None:
        span = self.spans.get(("approval", e.thread_id or "", e.item_id))
        if span is not None and span.end is None:
            span.end = at
            span.detail = f"{span.detail}: {e.decision}" if e.decision else span.detail

    def _queue_changed(self, e: ev.QueueChanged, at, seq) -> None:
        if e.thread_id is None or not e.known:
            return
        present = {entry.id for entry in e.entries}
        for entry in e.entries:
            self.spans.setdefault(("queue", e.thread_id, entry.id), Span(
                kind="queue", thread_id=e.thread_id, turn_id=e.turn_id, key=entry.id, start=at,
                detail=client_id_to_intent_id(entry.client_id) or ""))
        for (kind, thread, key), span in self.spans.items():
            if kind == "queue" and thread == e.thread_id and key not in present and span.end is None:
                span.end = at

    def _report(self, e: ev.Report, at, seq, event_id: str) -> None:
        detail = e.detail
        intent = detail.get("intent_id")
        self.reports.append(PersonReport(
            seq=seq, at=at, thread_id=e.thread_id, turn_id=e.turn_id, rule_id=e.rule_id, finding=e.finding,
            action=detail.get("action") if isinstance(detail.get("action"), str) else None,
            shadow=bool(detail.get("shadow")), intent_id=intent if isinstance(intent, str) else None,
            event_id=event_id))
        if "usage_seq" in detail:
            self.budget_crossings.append(_crossing(e, at, seq))

    def _decision(self, e: ev.DecisionRecorded, at, seq) -> None:
        self.decisions.append(Decision(seq=seq, at=at, thread_id=e.thread_id, intent_id=e.intent_id,
                                       action=e.action, reason=e.reason, rule_id=e.rule_id, shadow=e.shadow))

    def _goal(self, e: ev.GoalUpdated | ev.GoalCleared, at, seq) -> None:
        """A goal report whose status differs from the last change's: a change (every
        goal turn's end reports the goal again, mostly with the same status)."""
        thread = self.projection.threads.get(e.thread_id) if e.thread_id is not None else None
        goal = thread.goal if thread is not None else None
        if goal is None or self._goal_status.get(e.thread_id) == goal.status:
            return
        self._goal_status[e.thread_id] = goal.status
        self.goal_changes.append(GoalChange(
            seq=seq, at=at, thread_id=e.thread_id, status=goal.status, by=goal.changed_by,
            token_budget=goal.token_budget, tokens_used=goal.tokens_used, turn_id=goal.turn_id))

    def _undecodable(self, e: ev.Undecodable, at, seq) -> None:
        self.undecodable += 1

    # -- views ------------------------------------------------------------------

    def trigger(self, turn: Turn) -> tuple[str | None, bool]:
        """What started ``turn`` and whether that was inferred: as kept at its end, else as
        the ledger's fold knows it now (a turn still open, or one of a fold's recent turns)."""
        if turn.trigger is not None:
            return turn.trigger, turn.trigger_inferred
        thread = self.projection.threads.get(turn.thread_id)
        found = thread.turn_trigger(turn.turn_id) if thread is not None else None
        return found if found is not None else (None, False)

    def usage_of_turns(self) -> dict[tuple[str | None, str | None], list[Figures]]:
        """The usage of each turn, under the id the ledger's fold knows it by (a Claude
        Code turn's transcript and hooks name it differently, so one turn may have several)."""
        out: dict[tuple[str | None, str | None], list[Figures]] = {}
        for (thread_id, turn_id), row in self.usage.rows().items():
            thread = self.projection.threads.get(thread_id) if thread_id is not None else None
            canonical = thread.canonical_turn(turn_id) if thread is not None and turn_id is not None else turn_id
            out.setdefault((thread_id, canonical), []).append(row)
        return out

    def first_activity_after(self, thread_id: str, turn_id: str, after_seq: int) -> Progress | None:
        for at, seq in self.activity.get((thread_id, turn_id), ()):
            if seq > after_seq:
                return Progress(at=at, seq=seq)
        return None


def _crossing(e: ev.Report, at: float | None, seq: int) -> BudgetCrossing:
    """A budget report's figures, each None where the detail has no such value of its type."""
    detail = e.detail

    def of(name: str, kind: type | tuple[type, ...]):
        value = detail.get(name)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    number = (int, float)
    return BudgetCrossing(
        seq=seq, at=at, rule_id=e.rule_id, thread_id=e.thread_id, turn_id=e.turn_id, measure=of("measure", str),
        figure=of("figure", number), limit=of("limit", number), per=of("per", str), instance=of("instance", str),
        source_kind=of("source_kind", str), usage_seq=of("usage_seq", int), price_date=of("price_date", str),
        unpriced_models=of("unpriced_models", str) or None, action=of("action", str), shadow=bool(detail.get("shadow")),
        intent_id=of("proposed", str) or of("would_be_intent", str))


def _one_turn(kept: Turn | None, gone: Turn, turn_id: str) -> Turn:
    """One turn from what two sources' ids of it gathered: the earliest start, and the
    end the one known by ``turn_id`` saw (else the other's)."""
    if kept is None:
        return msgspec.structs.replace(gone, turn_id=turn_id)
    starts = [t for t in (kept, gone) if t.started_at is not None]
    first = min(starts, key=lambda t: t.started_at or 0.0) if starts else kept
    ended = kept if kept.status is not None else gone
    return msgspec.structs.replace(
        kept, started_at=first.started_at, seq=min((t.seq for t in (kept, gone) if t.seq), default=0),
        status=ended.status, ended_at=ended.ended_at, duration_ms=ended.duration_ms, ended_seq=ended.ended_seq)


_STEPS = {
    ev.TurnStarted: Facts._turn_started,
    ev.TurnCompleted: Facts._turn_completed,
    ev.ItemStarted: Facts._item_started,
    ev.ItemCompleted: Facts._item_completed,
    ev.AgentMessage: Facts._agent_message,
    ev.UserMessage: Facts._user_message,
    ev.ApprovalRequested: Facts._approval_requested,
    ev.ApprovalResolved: Facts._approval_resolved,
    ev.QueueChanged: Facts._queue_changed,
    ev.DecisionRecorded: Facts._decision,
    ev.Undecodable: Facts._undecodable,
    ev.GoalUpdated: Facts._goal,
    ev.GoalCleared: Facts._goal,
}


def fold_facts(entries, prices: PriceTable | None = None) -> Facts:
    return Facts(prices).fold(entries)
