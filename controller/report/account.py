"""The supervision account: what tillerman did and what it came to, from the facts
``tillerman.controller.report.fold`` folded. Pure: no I/O, no clock.

Every figure is a ``Figure``: its value, how it was computed, and from how many
events. A figure that cannot be computed has no value and says why, so a missing
measurement never reads as a zero. What turns spent (``Spend``: tokens and their cost,
priced response by response) is read from the usage the ledger recorded; a turn with no
usage recorded is counted apart, never as 0 tokens, and a response with no price makes
the cost null with the reason. The window (``since``/``until``) selects what is
counted by when it began (an intent by its proposal, a turn by its end but by its start
for what started it, a report, a goal change or a review call by its time); states are
always those at the end of the ledger.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable

import msgspec

from tillerman.controller.report.fold import STALL_FINDING, BudgetCrossing, Facts
from tillerman.controller.report.usage import Figures
from tillerman.ledger.intent_states import State, is_terminal
from tillerman.ledger.intents import Intent
from tillerman.ledger.labels import VERDICTS, Labels, reviewer_agrees, subject_of
from tillerman.ledger.projections import IntentView
from tillerman.ledger.reviews import NEVER_RAN, is_cost
from tillerman.ledger.snapshot import GOAL_BUDGET_LIMITED

BY_CHOICES = ("task_class", "mode", "rule", "owner", "thread")
USAGE_FIELDS = ("input", "cached_input", "cache_write", "output", "reasoning")
DEFAULT_BY = ("mode", "task_class")
#: Decisions that hold an intent back for a hazard (an approval, a critical tool).
HOLD_ACTIONS = frozenset({"observe_critical"})
EFFECT_STATES = frozenset({State.EFFECT_VERIFIED, State.EFFECT_FAILED})


class Figure(msgspec.Struct, kw_only=True, omit_defaults=True):
    value: int | float | None
    how: str
    events: int
    why: str | None = None  # set when there is no value


def count(value: int, how: str, events: int | None = None) -> Figure:
    return Figure(value=value, how=how, events=value if events is None else events)


def ratio(numerator: int, denominator: int, how: str, events: int, why_none: str) -> Figure:
    if denominator == 0:
        return Figure(value=None, how=how, events=events, why=why_none)
    return Figure(value=round(numerator / denominator, 4), how=f"{how}: {numerator}/{denominator}", events=events)


class Delays(msgspec.Struct, kw_only=True):
    p50: Figure
    p95: Figure
    max: Figure


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of the values at or below it."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def delays(values: list[float], what: str, why_none: str) -> Delays:
    ordered = sorted(values)
    how = f"{what}, seconds, nearest-rank over {len(ordered)} intents"

    def one(q: float | None) -> Figure:
        if not ordered:
            return Figure(value=None, how=how, events=0, why=why_none)
        value = ordered[-1] if q is None else percentile(ordered, q)
        return Figure(value=round(value, 3), how=how, events=2 * len(ordered))

    return Delays(p50=one(0.5), p95=one(0.95), max=one(None))


class Group(msgspec.Struct, kw_only=True):
    key: dict[str, str]
    proposed: Figure
    dispatched: Figure
    held: Figure
    rejected: Figure
    rejected_by_reason: dict[str, int]
    expired_by_reason: dict[str, int]
    in_flight: Figure
    precision_effect: Figure
    precision_ack: Figure
    intent_to_ack: Delays
    ack_to_effect: Delays


class Delivery(msgspec.Struct, kw_only=True):
    duplicate_deliveries: Figure
    silently_lost: Figure
    lost_after_accept: Figure
    lost_intents: list[str]
    duplicated_intents: list[str]
    ok: bool  # both must be zero


class Spend(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What some turns spent: their tokens (``input``, ``cached_input``, ``cache_write``,
    ``output``, ``reasoning``, ``total``, counted as ``tillerman usage`` counts them) and
    cost. ``cost_usd`` is None when a response had no price (``cost_missing`` says whose
    and why), every figure None when none of the turns recorded usage (``why``)."""

    how: str
    turns: int
    turns_without_usage: int
    tokens: dict[str, int | None]
    cost_usd: float | None
    cost_missing: list[dict[str, str | None]] = []
    why: str | None = None
    out_of_range: list[str] = []


class CancelledWork(msgspec.Struct, kw_only=True):
    interrupted_turns: Figure
    interrupted_by_intent: Figure
    turn_seconds: Figure
    commands_terminated: Figure
    command_seconds: Figure
    spend: Spend  # of the interrupted turns
    spend_by_intent: Spend  # of those a dispatched interrupt intent targeted
    queue_withdrawn: Figure


class AfterIntervention(msgspec.Struct, kw_only=True):
    """One dispatched intervention and the turns of its thread that ended after it, up to
    the next one dispatched there."""

    intent_id: str
    thread_id: str
    mode: str
    dispatched_at: float | None
    turn_ids: list[str]
    spend: Spend


class AfterInterventions(msgspec.Struct, kw_only=True):
    spend: Spend
    items: list[AfterIntervention]


class OwnerInterruptions(msgspec.Struct, kw_only=True):
    escalations: Figure
    reports: Figure
    reports_by_rule: dict[str, int]


class Reviewer(msgspec.Struct, kw_only=True):
    calls: Figure
    cost_usd: Figure
    tokens: Figure
    # name -> its calls, tokens and cost, as above: what each [[reviewer]] budget is set against
    by_reviewer: dict[str, dict[str, Figure]]
    outcomes: dict[str, int]
    dispositions: dict[str, int]
    # Calibration: reviewers that sent a known-bad probe on to the gate -> those probes.
    flagged: dict[str, list[str]]


class Stall(msgspec.Struct, kw_only=True):
    thread_id: str
    turn_id: str
    at: float | None
    seq: int
    ended: str  # recovered_after_intervention | recovered_alone | abandoned | unresolved
    by_intent: str | None = None


class Stalls(msgspec.Struct, kw_only=True):
    detected: Figure
    recovered_after_intervention: Figure
    recovered_alone: Figure
    abandoned: Figure
    unresolved: Figure
    items: list[Stall]


class ThreadGoals(msgspec.Struct, kw_only=True):
    """One thread's Codex goal over the window and what started its turns."""

    thread_id: str
    goal_status: str | None  # as the ledger ends (None: no goal was seen on the thread)
    token_budget: int | None
    tokens_used: int | None
    goal_statuses: list[str]  # each change of its goal's status in the window, in order
    turns_by_trigger: dict[str, int]  # user, goal, queue, unknown; "not known" for a turn without one


class Goals(msgspec.Struct, kw_only=True):
    turns_by_trigger: dict[str, Figure]
    inferred_triggers: Figure
    goal_changes: Figure
    budget_limited: Figure
    interrupts_goal_went_on: Figure  # interrupts that ended one turn of a goal that went on
    threads: list[ThreadGoals]


class Budgets(msgspec.Struct, kw_only=True):
    crossings: Figure
    items: list[BudgetCrossing]


class Precision(msgspec.Struct, kw_only=True):
    """Some subjects measured against the owner's labels: of those labeled, how many useful."""

    precision: Figure  # labeled useful / labeled
    labeled: int
    unlabeled: int
    verdicts: dict[str, int]  # the labeled ones by verdict


class Disagreement(msgspec.Struct, kw_only=True):
    checkpoint_id: str
    intent_id: str
    disposition: str
    verdict: str  # the owner's, on the intent
    note: str | None = None


class Agreement(msgspec.Struct, kw_only=True):
    """A reviewer's dispositions against the owner's labels of the intents they were about
    (``tillerman.ledger.labels.reviewer_agrees``)."""

    agreement: Figure  # agreeing / compared
    compared: int
    disagreements: list[Disagreement]


class OwnerLabels(msgspec.Struct, kw_only=True):
    """Precision against the owner's labels (``tillerman label``): per rule (its findings
    and the intents it proposed), per reviewer (its answers), per mode (the intents), and
    each reviewer's agreement with the owner. The label that stands is the latest."""

    labels: Figure
    by_rule: dict[str, Precision]
    by_reviewer: dict[str, Precision]
    by_mode: dict[str, Precision]
    reviewer_agreement: dict[str, Agreement]


class Account(msgspec.Struct, kw_only=True):
    events: int
    since: float | None
    until: float | None
    first_at: float | None
    last_at: float | None
    by: tuple[str, ...]
    totals: Group
    groups: list[Group]
    delivery: Delivery
    cancelled_work: CancelledWork
    after_interventions: AfterInterventions
    owner_interruptions: OwnerInterruptions
    reviewer: Reviewer
    stalls: Stalls
    goals: Goals
    budgets: Budgets
    owner_labels: OwnerLabels
    undecodable: int
    prices: dict[str, str]  # the price table's date, source and digest


def label(intent: Intent, dimension: str) -> str:
    match dimension:
        case "task_class":
            return intent.task_label
        case "mode":
            return intent.mode
        case "rule":
            return intent.rule_id or "(none)"
        case "owner":
            return intent.owner or intent.producer
        case "thread":
            return intent.thread_id
    raise ValueError(f"--by takes one of {', '.join(BY_CHOICES)}, not {dimension!r}")


def account(facts: Facts, *, since: float | None = None, until: float | None = None,
            by: Iterable[str] = DEFAULT_BY) -> Account:
    by = tuple(by)
    unknown = [d for d in by if d not in BY_CHOICES]
    if unknown or not by:
        raise ValueError(f"--by takes one of {', '.join(BY_CHOICES)}, not {', '.join(unknown) or 'nothing'}")

    def inside(at: float | None) -> bool:
        return at is None or ((since is None or at >= since) and (until is None or at < until))

    views = [v for v in facts.projection.intents.values() if inside(v.intent.created_at)]
    grouped: dict[tuple[str, ...], list[IntentView]] = {}
    for view in views:
        grouped.setdefault(tuple(label(view.intent, d) for d in by), []).append(view)
    held = {d.intent_id for d in facts.decisions if not d.shadow and d.action in HOLD_ACTIONS}
    return Account(
        events=facts.events, since=since, until=until, first_at=facts.first_at, last_at=facts.last_at, by=by,
        totals=_group({}, views, held),
        groups=[_group(dict(zip(by, key, strict=True)), members, held) for key, members in sorted(grouped.items())],
        delivery=_delivery(facts, views),
        cancelled_work=_cancelled(facts, inside),
        after_interventions=_after_interventions(facts, inside),
        owner_interruptions=_owner(facts, inside),
        reviewer=_reviewer(facts, inside),
        stalls=_stalls(facts, inside),
        goals=_goals(facts, inside),
        budgets=_budgets(facts, inside),
        owner_labels=_owner_labels(facts, inside),
        undecodable=facts.undecodable,
        prices={"date": facts.usage.prices.date, "source": facts.usage.prices.source,
                "digest": facts.usage.prices.digest},
    )


# -- per intent ---------------------------------------------------------------------


def first_at(view: IntentView, states: Iterable[State]) -> float | None:
    wanted = set(states)
    return next((h.at for h in view.history if h.kind == "transition" and h.state in wanted), None)


def reached(view: IntentView, state: State) -> bool:
    return any(h.kind == "transition" and h.state == state for h in view.history)


def final_reason(view: IntentView) -> str:
    return next((h.reason for h in reversed(view.history) if h.kind == "transition"), "")


def _group(key: dict[str, str], views: list[IntentView], held: set[str]) -> Group:
    intent_events = sum(len(v.history) for v in views)
    dispatched = [v for v in views if reached(v, State.DISPATCH_UNKNOWN)]
    rejected = [v for v in views if v.state == State.REJECTED]
    expired = [v for v in views if v.state == State.EXPIRED]
    open_ = [v for v in views if not is_terminal(v.state, v.intent)]
    settled = [v for v in dispatched if is_terminal(v.state, v.intent)]
    checked = [v for v in settled if v.intent.has_check]
    unchecked = [v for v in settled if not v.intent.has_check]
    verified = sum(1 for v in checked if v.state == State.EFFECT_VERIFIED)
    acked = sum(1 for v in unchecked if v.state == State.ACKNOWLEDGED)
    to_ack, to_effect = [], []
    for view in views:
        ack_at = first_at(view, (State.ACKNOWLEDGED,))
        if ack_at is not None:
            to_ack.append(ack_at - view.intent.created_at)
        effect_at = first_at(view, EFFECT_STATES)
        if ack_at is not None and effect_at is not None:
            to_effect.append(effect_at - ack_at)
    return Group(
        key=key,
        proposed=count(len(views), "intent_proposed events"),
        dispatched=count(len(dispatched), "intents moved proposed -> dispatch_unknown (a request was sent)"),
        held=count(sum(1 for v in views if v.intent.id in held),
                   "intents with at least one observe_critical decision (held for an approval, a critical tool"
                   " or an external effect)", sum(1 for v in views for h in v.history
                                                  if h.kind == "decision" and h.state in HOLD_ACTIONS)),
        rejected=count(len(rejected), "intents whose last transition is to rejected"),
        rejected_by_reason=dict(sorted(Counter(final_reason(v) for v in rejected).items())),
        expired_by_reason=dict(sorted(Counter(final_reason(v) for v in expired).items())),
        in_flight=count(len(open_), "intents not in a terminal state at the end of the ledger", intent_events),
        precision_effect=ratio(
            verified, len(checked), "settled dispatched intents with --expect/--verify that reached effect_verified",
            intent_events, "no settled dispatched intent had an effect to check (--expect/--verify)"),
        precision_ack=ratio(
            acked, len(unchecked), "settled dispatched intents with nothing to verify that reached acknowledged",
            intent_events, "no settled dispatched intent was without an effect check"),
        intent_to_ack=delays(to_ack, "intent_proposed -> first transition to acknowledged",
                             "no intent was acknowledged"),
        ack_to_effect=delays(to_effect, "acknowledged -> effect_verified or effect_failed",
                             "no acknowledged intent reached an effect verdict"),
    )


def deadline(view: IntentView) -> float | None:
    """When an open intent should have been settled or reported by the state it is in."""
    intent = view.intent
    match view.state:
        case State.PROPOSED | State.QUEUED:
            return intent.expires_at
        case State.DISPATCH_UNKNOWN:
            return intent.ack_deadline
        case State.ACKNOWLEDGED | State.ACTION_STARTED:
            return intent.effect_deadline
    return None


def _delivery(facts: Facts, views: list[IntentView]) -> Delivery:
    reported = {r.intent_id for r in facts.reports if r.intent_id} | {
        d.intent_id for d in facts.decisions if not d.shadow and d.action in ("report_overdue", "escalate")}
    end = facts.last_at
    lost = sorted(v.intent.id for v in views if not is_terminal(v.state, v.intent)
                  and v.intent.id not in reported and end is not None
                  and (limit := deadline(v)) is not None and end > limit)
    ids = {v.intent.id for v in views}
    echoes = {i: e for i, e in facts.echoes.items() if i in ids}
    duplicated = sorted(i for i, e in echoes.items() if _deliveries(e) > 1)
    extra = sum(_deliveries(e) - 1 for e in echoes.values() if _deliveries(e) > 1)
    after_accept = [v for v in views if v.state == State.EXPIRED and final_reason(v) == "lost_after_accept"]
    echo_events = sum(len(e) for e in echoes.values())
    return Delivery(
        duplicate_deliveries=count(extra, "echoes of our clientId beyond the first per intent (distinct turns or"
                                          " item ids of user_message events)", echo_events),
        silently_lost=count(len(lost), "open intents past the deadline of their state at the ledger's last time,"
                                       " with no report and no report_overdue/escalate decision naming them",
                            sum(len(v.history) for v in views)),
        lost_after_accept=count(len(after_accept), "intents expired with reason lost_after_accept (reported)"),
        lost_intents=lost, duplicated_intents=duplicated, ok=not lost and not extra,
    )


def _deliveries(echoes: set[tuple[str | None, str | None]]) -> int:
    """One delivery per turn it landed in, or per item id when a turn shows more than one."""
    turns = {turn for turn, _ in echoes}
    items = {item for _, item in echoes if item is not None}
    return max(len(turns), len(items))


# -- the session --------------------------------------------------------------------


def _cancelled(facts: Facts, inside: Callable[[float | None], bool]) -> CancelledWork:
    turns = [t for t in facts.turns.values() if t.status == "interrupted" and inside(t.ended_at)]
    interrupts = {(v.intent.thread_id, v.intent.expected_turn_id) for v in facts.projection.intents.values()
                  if v.intent.mode == "interrupt" and reached(v, State.DISPATCH_UNKNOWN)}
    keys = {(t.thread_id, t.turn_id): t for t in turns}
    terminated = [c for c in facts.calls.values() if (c.thread_id, c.turn_id) in keys
                  and _cut_short(c, keys[(c.thread_id, c.turn_id)])]
    turn_seconds = [t.seconds for t in turns if t.seconds is not None]

    def ran(call) -> float | None:
        """From its start to its end, or to the turn's end when it outlived the turn."""
        turn_end = keys[(call.thread_id, call.turn_id)].ended_at
        end = call.ended_at if call.ended_at is not None and (turn_end is None or call.ended_at <= turn_end) \
            else turn_end
        return None if end is None or call.started_at is None else max(0.0, end - call.started_at)

    command_seconds = [s for s in (ran(c) for c in terminated) if s is not None]
    usage = facts.usage_of_turns()
    by_intent = [t for t in turns if (t.thread_id, t.turn_id) in interrupts]
    withdrawn = [v for v in facts.projection.intents.values() if v.intent.mode == "queue"
                 and inside(v.intent.created_at) and v.state == State.EXPIRED and final_reason(v) == "withdrawn"]
    return CancelledWork(
        interrupted_turns=count(len(turns), "turn_completed events with status interrupted", len(turns)),
        interrupted_by_intent=count(sum(1 for t in turns if (t.thread_id, t.turn_id) in interrupts),
                                    "interrupted turns that a dispatched interrupt intent targeted"),
        turn_seconds=_seconds(turn_seconds, len(turns), "interrupted turns' run time (duration, else end - start)",
                              "no interrupted turn"),
        commands_terminated=count(len(terminated), "tool calls of interrupted turns still running when the turn ended"
                                                   " (completed after it, or never), or completed"
                                                   " interrupted/cancelled/aborted", 2 * len(terminated)),
        command_seconds=_seconds(command_seconds, len(terminated), "terminated calls' run time (start to the"
                                 " earlier of its end and the turn's end)", "no command was terminated"),
        spend=spend_of([(t.thread_id, t.turn_id) for t in turns], usage, "the interrupted turns' usage"),
        spend_by_intent=spend_of([(t.thread_id, t.turn_id) for t in by_intent], usage,
                                 "the usage of the interrupted turns a dispatched interrupt intent targeted"),
        queue_withdrawn=count(len(withdrawn), "queue intents expired withdrawn (a stop deleted them from the"
                                              " server's queue before they started a turn: no agent spend)"),
    )


def spend_of(turns: list[tuple[str, str]], usage: dict[tuple[str | None, str | None], list[Figures]],
             what: str) -> Spend:
    """What ``turns`` spent, from each turn's usage rows (``Facts.usage_of_turns``)."""
    summed, without = Figures(), 0
    for key in turns:
        rows = usage.get(key)
        if not rows:
            without += 1
        for row in rows or ():
            summed.merge(row)
    shown = summed.as_json()
    how = f"sum of {what}, priced response by response, over {len(turns) - without} of {len(turns)} turns"
    spend = Spend(how=how, turns=len(turns), turns_without_usage=without,
                  tokens={name: shown[name] for name in (*USAGE_FIELDS, "total")}, cost_usd=shown["cost_usd"],
                  cost_missing=shown["cost_missing"], out_of_range=shown.get("out_of_range", []))
    if turns and without == len(turns):
        return msgspec.structs.replace(spend, tokens=dict.fromkeys(spend.tokens), cost_usd=None,
                                       why="none of these turns recorded usage")
    return spend


def _after_interventions(facts: Facts, inside: Callable[[float | None], bool]) -> AfterInterventions:
    """Each dispatched intervention (in the window by its proposal) and the turns of its
    thread that ended after its dispatch, up to the next dispatch there; a turn still
    running counts to the last one. Whole turns: the turn a steer went into counts whole."""
    usage = facts.usage_of_turns()
    dispatched: dict[str, list[tuple[int, IntentView]]] = {}
    for view in facts.projection.intents.values():
        seq = next((h.seq for h in view.history if h.kind == "transition" and h.state == State.DISPATCH_UNKNOWN),
                   None)
        if seq is not None:
            dispatched.setdefault(view.intent.thread_id, []).append((seq, view))
    items: list[AfterIntervention] = []
    for thread_id, sent in sorted(dispatched.items()):
        sent.sort(key=lambda pair: pair[0])
        ends = sorted((t.ended_seq if t.status is not None else math.inf, t.turn_id)
                      for t in facts.turns.values() if t.thread_id == thread_id)
        for index, (seq, view) in enumerate(sent):
            if not inside(view.intent.created_at):
                continue
            until = sent[index + 1][0] if index + 1 < len(sent) else math.inf
            after = [turn_id for end, turn_id in ends if seq < end <= until]
            items.append(AfterIntervention(
                intent_id=view.intent.id, thread_id=thread_id, mode=view.intent.mode,
                dispatched_at=first_at(view, (State.DISPATCH_UNKNOWN,)), turn_ids=after,
                spend=spend_of([(thread_id, t) for t in after], usage,
                               "the usage of the turns that ended after this dispatch, before the thread's next")))
    every = [(item.thread_id, turn) for item in items for turn in item.turn_ids]
    return AfterInterventions(items=items, spend=spend_of(every, usage, "the usage of the turns that ended after"
                                                                        " each dispatched intervention"))


def _cut_short(call, turn) -> bool:
    if call.status in ("interrupted", "cancelled", "aborted"):
        return True
    return call.ended_seq is None or call.ended_seq > turn.ended_seq


def _seconds(values: list[float], events: int, how: str, why_none: str) -> Figure:
    if not values:
        return Figure(value=None, how=how, events=events, why=why_none if not events else "no times recorded")
    return Figure(value=round(sum(values), 3), how=f"sum of {how} over {len(values)}", events=events)


def _owner(facts: Facts, inside: Callable[[float | None], bool]) -> OwnerInterruptions:
    escalations = [d for d in facts.decisions if not d.shadow and d.action == "escalate" and inside(d.at)]
    reports = [r for r in facts.reports if not r.shadow and r.action != "observe" and inside(r.at)]
    return OwnerInterruptions(
        escalations=count(len({d.intent_id for d in escalations}), "intents with an escalate decision",
                          len(escalations)),
        reports=count(len(reports), "report events for a person (not shadow, not observe-only)"),
        reports_by_rule=dict(sorted(Counter(r.rule_id for r in reports).items())),
    )


def _budgets(facts: Facts, inside: Callable[[float | None], bool]) -> Budgets:
    """Each budget crossing in the window, with where its intent's journey ended."""
    items = []
    for crossing in facts.budget_crossings:
        if not inside(crossing.at):
            continue
        view = facts.projection.intents.get(crossing.intent_id) if crossing.intent_id else None
        if view is not None:
            crossing = msgspec.structs.replace(crossing, intent_state=str(view.state), intent_reason=final_reason(view))
        items.append(crossing)
    return Budgets(crossings=count(len(items), "report events of budget rules (one per crossing; shadow ones too)"),
                   items=items)


def _reviewer(facts: Facts, inside: Callable[[float | None], bool]) -> Reviewer:
    checkpoints = [c for c in facts.reviews.checkpoints.values() if inside(c.pending_at)]
    names = sorted({c.reviewer for c in checkpoints})
    spent = {name: _review_spend([c for c in checkpoints if c.reviewer == name]) for name in names}
    totals = _review_spend(checkpoints)
    committed = [c.committed for c in checkpoints if c.committed is not None]
    return Reviewer(
        **totals, by_reviewer=spent,
        outcomes=dict(sorted(Counter(c.outcome for c in committed).items())),
        dispositions=dict(sorted(Counter(c.disposition for c in committed if c.disposition).items())),
        flagged=facts.reviews.flagged(),
    )


def _review_spend(checkpoints: list) -> dict[str, Figure]:
    """The calls of some checkpoints and what they reported spending. A call that ran and
    reported no cost makes the cost unknown (None, with the known part in ``why``), as it
    makes a reviewer's budget unknown (``tillerman.ledger.reviews``)."""
    calls = [c for c in checkpoints if c.pending_at is not None]
    committed = [c.committed for c in checkpoints if c.committed is not None]
    events = len(calls) + len(committed)
    ran = [c.committed for c in calls if c.committed is not None and c.committed.outcome not in NEVER_RAN]
    costs = [c.cost_usd for c in ran if is_cost(c.cost_usd)]
    tokens = [c.tokens for c in committed if c.tokens is not None]

    def total(values: list, what: str, *, whole: bool) -> Figure:
        how = f"sum of review_committed {what}"
        if ran and not values:
            return Figure(value=None, how=how, events=events,
                          why=f"none of the {len(ran)} reviews that ran recorded its {what}")
        missing = len(ran) - len(values)
        if whole and missing:
            return Figure(value=None, how=how, events=events,
                          why=f"{missing} of the {len(ran)} reviews that ran recorded no {what} (the others:"
                              f" {round(sum(values), 6)})")
        note = f" ({missing} without one)" if missing > 0 else ""
        return Figure(value=round(sum(values), 6), how=how + note, events=events)

    return {"calls": count(len(calls), "review_pending events (one per checkpoint called)", events),
            "cost_usd": total(costs, "cost_usd", whole=True), "tokens": total(tokens, "tokens", whole=False)}


def _stalls(facts: Facts, inside: Callable[[float | None], bool]) -> Stalls:
    items: list[Stall] = []
    for report in facts.reports:
        match = STALL_FINDING.match(report.finding)
        if report.shadow or match is None or report.thread_id is None or not inside(report.at):
            continue
        items.append(_stall_end(facts, report.thread_id, match["turn"], report.at, report.seq))
    ended = Counter(s.ended for s in items)
    how = "stall reports (a turn_quiet finding) "
    return Stalls(
        detected=count(len(items), "report events with a turn_quiet finding"),
        recovered_after_intervention=count(ended["recovered_after_intervention"], how + "whose turn moved again"
                                           " after one of our intents on the thread was dispatched"),
        recovered_alone=count(ended["recovered_alone"], how + "whose turn moved again with no intent dispatched"),
        abandoned=count(ended["abandoned"], how + "whose turn ended interrupted or failed without moving again"),
        unresolved=count(ended["unresolved"], how + "whose turn had not moved again when the ledger ends"),
        items=items,
    )


def _stall_end(facts: Facts, thread_id: str, turn_id: str, at: float | None, seq: int) -> Stall:
    moved = facts.first_activity_after(thread_id, turn_id, seq)
    turn = facts.turns.get((thread_id, turn_id))
    if moved is None:
        if turn is not None and turn.status is not None and turn.status != "completed":
            return Stall(thread_id=thread_id, turn_id=turn_id, at=at, seq=seq, ended="abandoned")
        if turn is None or turn.status is None:
            return Stall(thread_id=thread_id, turn_id=turn_id, at=at, seq=seq, ended="unresolved")
        moved_seq = turn.ended_seq  # completed without another item: it recovered at its end
    else:
        moved_seq = moved.seq
    helper = next((v.intent.id for v in facts.projection.intents.values() if v.intent.thread_id == thread_id
                   and any(h.kind == "transition" and h.state == State.DISPATCH_UNKNOWN and seq < h.seq <= moved_seq
                           for h in v.history)), None)
    return Stall(thread_id=thread_id, turn_id=turn_id, at=at, seq=seq, by_intent=helper,
                 ended="recovered_after_intervention" if helper else "recovered_alone")


#: A turn whose trigger the fold does not know (a Claude Code turn, a turn it kept no
#: trigger of): counted under this name.
NOT_KNOWN = "not known"


def _goals(facts: Facts, inside: Callable[[float | None], bool]) -> Goals:
    """What started each turn that began in the window, and each thread's goal changes."""
    turns = [t for t in facts.turns.values() if inside(t.started_at if t.started_at is not None else t.ended_at)]
    triggers = {(t.thread_id, t.turn_id): facts.trigger(t) for t in turns}
    changes = [c for c in facts.goal_changes if inside(c.at)]
    by_thread: dict[str, Counter[str]] = {}
    for (thread_id, _), (trigger, _) in triggers.items():
        by_thread.setdefault(thread_id, Counter())[trigger or NOT_KNOWN] += 1
    threads = sorted(set(by_thread) | {c.thread_id for c in changes})
    known = Counter(trigger or NOT_KNOWN for trigger, _ in triggers.values())
    inferred = sum(1 for trigger, was_inferred in triggers.values() if trigger is not None and was_inferred)
    limited = [c for c in changes if c.status == GOAL_BUDGET_LIMITED]
    return Goals(
        turns_by_trigger={trigger: count(n, f"turns started by {trigger}" if trigger != NOT_KNOWN else
                                         "turns whose trigger is not known (not a Codex turn, or not kept)", len(turns))
                          for trigger, n in sorted(known.items())},
        inferred_triggers=count(inferred, "turns whose trigger the live fold inferred (the app-server does not"
                                          " say; a rollout does)", len(turns)),
        goal_changes=count(len(changes), "goal_updated/goal_cleared events that changed a goal's status"),
        budget_limited=count(len(limited), "goal changes to budgetLimited (the token budget spent; Codex starts no"
                                           " more turns for it)"),
        interrupts_goal_went_on=_interrupts_goal_went_on(facts, inside),
        threads=[_thread_goals(facts, thread_id, by_thread.get(thread_id, Counter()),
                               [c.status for c in changes if c.thread_id == thread_id]) for thread_id in threads],
    )


def _interrupts_goal_went_on(facts: Facts, inside: Callable[[float | None], bool]) -> Figure:
    """Interrupts acknowledged on a thread whose goal stayed active (their evidence says
    ``goal_active``): each ended one turn, and Codex started the goal's next one."""
    interrupts = [v for v in facts.projection.intents.values()
                  if v.intent.mode == "interrupt" and inside(v.intent.created_at)]
    went_on = sum(1 for v in interrupts if any(
        h.kind == "transition" and h.reason == "turn_interrupted" and h.evidence.get("goal_active") is True
        for h in v.history))
    return count(went_on, "interrupts acknowledged turn_interrupted while the thread's goal stayed active"
                          " (the goal's next turn followed; a stop pauses the goal)", len(interrupts))


def _thread_goals(facts: Facts, thread_id: str, triggers: Counter[str], statuses: list[str]) -> ThreadGoals:
    thread = facts.projection.threads.get(thread_id)
    goal = thread.goal if thread is not None else None
    return ThreadGoals(
        thread_id=thread_id, goal_status=goal.status if goal else None,
        token_budget=goal.token_budget if goal else None, tokens_used=goal.tokens_used if goal else None,
        goal_statuses=statuses, turns_by_trigger=dict(sorted(triggers.items())))


#: The kinds the measures against the owner's labels are folded from (``rule_records``).
LABELED_KINDS = frozenset({"report", "intent_proposed", "review_pending", "review_committed", "owner_labeled"})


def rule_records(facts: Facts) -> dict[str, Precision]:
    """Each rule's labeled record over the whole ledger: what ``rules diff`` and ``rules
    promote`` show as evaluation evidence. ``facts`` may be folded from ``LABELED_KINDS``
    only."""
    return _owner_labels(facts, lambda at: True).by_rule


def _owner_labels(facts: Facts, inside: Callable[[float | None], bool]) -> OwnerLabels:
    """The subjects in the window (an intent by its proposal, a finding by its time, a
    reviewer's answer by its call) against the labels standing at the end of the ledger."""
    labels = facts.labels
    intents = [v.intent for v in facts.projection.intents.values() if inside(v.intent.created_at)]
    findings = [r for r in facts.reports if inside(r.at)]
    answers = [c for c in facts.reviews.checkpoints.values()
               if c.committed is not None and not c.probe and inside(c.pending_at)]
    by_rule: dict[str, list[str]] = {}
    for report in findings:
        by_rule.setdefault(report.rule_id, []).append(subject_of("finding", report.event_id))
    for intent in intents:
        if intent.rule_id is not None:
            by_rule.setdefault(intent.rule_id, []).append(subject_of("intent", intent.id))
    by_mode: dict[str, list[str]] = {}
    for intent in intents:
        by_mode.setdefault(intent.mode, []).append(subject_of("intent", intent.id))
    by_reviewer: dict[str, list[str]] = {}
    for checkpoint in answers:
        by_reviewer.setdefault(checkpoint.reviewer, []).append(subject_of("review", checkpoint.checkpoint_id))
    return OwnerLabels(
        labels=count(len(labels), "subjects with an owner_labeled event (the latest stands)",
                     sum(len(labels.history(given.subject)) for given in labels.all_current())),
        by_rule={rule: precision(labels, subjects, "the rule's findings and intents")
                 for rule, subjects in sorted(by_rule.items())},
        by_reviewer={name: precision(labels, subjects, "the reviewer's answers")
                     for name, subjects in sorted(by_reviewer.items())},
        by_mode={mode: precision(labels, subjects, "the mode's intents") for mode, subjects in sorted(by_mode.items())},
        reviewer_agreement={name: agreement(labels, [c for c in answers if c.reviewer == name])
                            for name in sorted(by_reviewer)},
    )


def precision(labels: Labels, subjects: list[str], what: str) -> Precision:
    """``subjects`` against the labels standing on them: labeled useful / labeled."""
    standing = [given for subject in subjects if (given := labels.current(subject)) is not None]
    verdicts = Counter(given.verdict for given in standing)
    return Precision(
        precision=ratio(verdicts["useful"], len(standing), f"{what} the owner labeled useful / labeled",
                        len(standing), f"none of {what} is labeled ({len(subjects)} unlabeled)"),
        labeled=len(standing), unlabeled=len(subjects) - len(standing),
        verdicts={verdict: verdicts[verdict] for verdict in VERDICTS if verdicts[verdict]})


def agreement(labels: Labels, checkpoints: list) -> Agreement:
    """A reviewer's accepted answers about intents the owner labeled: whether its
    disposition said what the owner's verdict says (``reviewer_agrees``)."""
    compared, disagreements = 0, []
    for checkpoint in checkpoints:
        disposition = checkpoint.committed.disposition
        owner = labels.current(subject_of("intent", checkpoint.intent_id)) if checkpoint.intent_id else None
        if disposition is None or owner is None:
            continue
        compared += 1
        if not reviewer_agrees(disposition, owner.verdict):
            disagreements.append(Disagreement(checkpoint_id=checkpoint.checkpoint_id, intent_id=checkpoint.intent_id,
                                              disposition=disposition, verdict=owner.verdict, note=owner.note))
    return Agreement(
        agreement=ratio(compared - len(disagreements), compared,
                        "answers whose disposition agrees with the owner's label of their intent / compared",
                        compared, "the owner labeled none of the intents this reviewer answered about"),
        compared=compared, disagreements=disagreements)
