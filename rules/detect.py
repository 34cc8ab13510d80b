"""Detection rules: observations in a ``ThreadSnapshot`` → findings.

``detect`` is pure like ``decide``: the snapshot and ``now`` are all it knows. Each
finding carries a ``key`` that stays the same while the same condition instance
lasts (the same quiet period, the same failing command in the same turn, the same
approval wait), so the caller records it once however often it asks.

Active and shadow rules are evaluated; a shadow finding is marked ``shadow`` and is
recorded for the disagreement set, never turned into a dispatchable intent.
Proposed and retired rules, rules past ``expires`` and rules filtered to other
threads produce nothing.

``intent_overdue`` has nothing to look at in a snapshot: overdue intents are found
by ``decide()`` (``report_overdue``), and the rule names who owns that report.

``goal_budget_limited`` is found once per change of the thread's Codex goal to
``budgetLimited`` (its key names the change, not the turn running then).

``budget`` is found once per crossing: its key names the scope instance (the turn, the
UTC day, the goal, the thread) and the limit, not the usage line that crossed it
(``tillerman.rules.budget``); an owner budget's key names no thread, so the owner's day
is reported once whichever thread crossed it.

``next_due`` tells replay's virtual clock when the next time-based finding falls due.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from typing import Any

import msgspec

from tillerman.ledger.snapshot import GOAL_BUDGET_LIMITED, ThreadSnapshot, Watched
from tillerman.rules.budget import Crossing, crossing
from tillerman.rules.decision import Action
from tillerman.rules.durations import format_duration
from tillerman.rules.ruleset import (
    ANY,
    AnyCondition,
    ApprovalWaiting,
    Budget,
    CriticalToolRunning,
    GoalBudgetLimited,
    RepeatedFailure,
    Rule,
    RuleSet,
    RuleStatus,
    TurnLong,
    TurnQuiet,
    matches_thread,
)

_COMMON_FIELDS = ("thread_id", "turn_id")
#: The placeholders a rule's text may use, per condition kind. A template copies only
#: what it names, and nothing here is the text of a prompt or a command.
TEMPLATE_FIELDS: dict[str, tuple[str, ...]] = {
    "turn_quiet": (*_COMMON_FIELDS, "quiet_for"),
    "repeated_failure": (*_COMMON_FIELDS, "count", "tool", "exit_code", "args_digest"),
    "approval_waiting": (*_COMMON_FIELDS, "waiting_for"),
    "critical_tool_running": (*_COMMON_FIELDS, "running_for"),
    "intent_overdue": _COMMON_FIELDS,
    "turn_long": (*_COMMON_FIELDS, "running_for"),
    "goal_budget_limited": (*_COMMON_FIELDS, "token_budget", "tokens_used"),
    "budget": (*_COMMON_FIELDS, "measure", "figure", "limit", "per"),
}

EVALUATED_STATUSES = frozenset({"active", "shadow"})


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    rule_id: str
    rule_version: int
    status: RuleStatus  # "active" or "shadow"
    action: Action
    thread_id: str
    turn_id: str | None
    key: str  # stable dedup key: rule, thread, turn, condition instance
    finding: str  # one line saying what was observed
    text: str | None  # the rule's text rendered, for an intent to send
    ack_deadline: float | None  # seconds the agent has to acknowledge (the rule's), not a moment
    verify: str | None = None  # the rule's readback command for the proposed intent
    detail: dict[str, Any]  # the observed numbers, for the record


class _Observation(msgspec.Struct, frozen=True, kw_only=True):
    instance: str  # what makes this occurrence distinct within the turn
    finding: str
    fields: dict[str, str]  # template placeholders
    detail: dict[str, Any]
    per_turn: bool = True  # the condition instance lives in one turn (its key names the turn)
    per_thread: bool = True  # the condition instance is the thread's (an owner budget's is not)


class _Timer(msgspec.Struct, frozen=True, kw_only=True):
    """Something lasting since ``since`` that a condition reports once it has lasted ``limit``."""

    instance: str
    what: str
    field: str  # the placeholder for how long it has lasted
    since: float
    limit: float


def detect(snapshot: ThreadSnapshot, now: float, ruleset: RuleSet) -> list[Finding]:
    """Findings of every evaluated rule, ordered by rule id then key."""
    findings = [
        _finding(rule, snapshot, observation)
        for rule in _evaluated(ruleset, snapshot, now)
        for observation in _observe(rule.condition, snapshot, now, ruleset.prices)
    ]
    return sorted(findings, key=lambda f: (f.rule_id, f.key))


def next_due(snapshot: ThreadSnapshot, now: float, ruleset: RuleSet) -> float | None:
    """The first moment after ``now`` at which ``detect`` finds something new if no
    event arrives before: where replay's virtual clock jumps next. None: never."""
    timers = (_timer(rule.condition, snapshot) for rule in _evaluated(ruleset, snapshot, now))
    return min((t.since + t.limit for t in timers if t is not None and t.since + t.limit > now), default=None)


class Triggers(msgspec.Struct, frozen=True):
    """What ``detect`` looks at in one snapshot, whatever the time: the lasting
    conditions (since, limit, rule) and the repeated-failure thresholds (count, rule)
    of every rule evaluated for the thread, the count of its most repeated
    failure, and the goal rules when its goal is budget-limited. A function of the snapshot alone (of its ``Watched`` part), so a caller
    that keeps it can ask it at every new ``now`` (replay does, at every event, on its
    virtual clock)."""

    timers: tuple[tuple[float, float, Rule], ...]
    failures: tuple[tuple[int, Rule], ...]
    most_failures: int = 0
    goals: tuple[Rule, ...] = ()  # goal_budget_limited rules, while the goal is budget-limited
    budgets: tuple[Rule, ...] = ()  # budget rules whose figure is at or over its limit


def triggers(watched: Watched, ruleset: RuleSet) -> Triggers:
    """The triggers of a thread, from its ``Watched`` part. Which rules apply and which
    moment each one's timer runs from depend only on the thread and on which of those
    moments are set (``_timer``'s own decisions): that plan is made once per such
    shape and rule set (``_plan``), and a thread's triggers are its moments put into
    it. Replay takes them after every event it folds."""
    sinces = (watched.active_turn_started_at, watched.last_progress_at,
              watched.approval_pending_since, watched.critical_tool_since)
    shape = (watched.supervised, watched.active_turn_id is None, watched.approval_pending, watched.critical_tool,
             sinces[0] is None, sinces[1] is None, sinces[2] is None, sinces[3] is None)
    plans = _plans(ruleset)
    key = (watched.thread_id, shape) if plans.by_thread else shape
    plan = plans.shapes.get(key)
    if plan is None:
        plan = plans.shapes[key] = _plan(ruleset, watched.thread_id, shape)
    timers = tuple([(sinces[index], limit, rule) for index, limit, rule in plan.timers])
    goals = plan.goals if watched.goal_budget_limited_at is not None else ()
    budgets = _crossed(plan.budgets, watched, ruleset)
    if watched.most_failures and plan.failures:
        return Triggers(timers, plan.failures, watched.most_failures, goals, budgets)
    return Triggers(timers, (), 0, goals, budgets)


def _crossed(rules: tuple[Rule, ...], watched: Watched, ruleset: RuleSet) -> tuple[Rule, ...]:
    """The budget rules whose figure the thread's last counted response put at or over
    the limit: computed when its ``Watched`` changes (a response counted), not per round."""
    usage = watched.usage
    if usage is None or not rules:
        return ()
    return tuple(r for r in rules if crossing(r.condition, usage, ruleset.prices) is not None)


def triggers_next_due(w: Triggers, now: float) -> float | None:
    """``next_due`` of the snapshot these triggers were taken from: the same answer."""
    return min((since + limit for since, limit, rule in w.timers if since + limit > now and rule.in_force(now)),
               default=None)


def triggers_may_find(w: Triggers, now: float) -> bool:
    """False only when ``detect`` of the snapshot these triggers were taken from is
    certainly empty at ``now``: no lasting condition has lasted its limit (the very
    comparison ``_observe`` makes), no command failed as often as a
    repeated-failure rule counts, and no goal rule sees a budget-limited goal."""
    for since, limit, rule in w.timers:
        if now - since >= limit and rule.in_force(now):
            return True
    return (any(w.most_failures >= limit for limit, _ in w.failures) or any(r.in_force(now) for r in w.goals)
            or any(r.in_force(now) for r in w.budgets))


class _Plan(msgspec.Struct, frozen=True):
    timers: tuple[tuple[int, float, Rule], ...]  # (index of the moment in ``_SINCES``, limit, rule)
    failures: tuple[tuple[int, Rule], ...]
    goals: tuple[Rule, ...]
    budgets: tuple[Rule, ...]


class _Plans(msgspec.Struct):
    ruleset: RuleSet  # held: its id keys ``_PLANS``
    by_thread: bool  # a rule names threads: which rules apply depends on the thread
    shapes: dict[tuple, _Plan]


#: The moments a lasting condition can run from, as ``Watched`` names them.
_SINCES = ("active_turn_started_at", "last_progress_at", "approval_pending_since", "critical_tool_since")
_PLANS: dict[int, _Plans] = {}  # id(rule set) -> its plans; a few rule sets at most (the daemon reloads)


def _plans(ruleset: RuleSet) -> _Plans:
    plans = _PLANS.get(id(ruleset))
    if plans is None or plans.ruleset is not ruleset:
        if len(_PLANS) >= 8:
            _PLANS.clear()
        plans = _PLANS[id(ruleset)] = _Plans(ruleset, any(r.threads != ANY for r in ruleset.rules), {})
    return plans


def _plan(ruleset: RuleSet, thread_id: str, shape: tuple) -> _Plan:
    """Ask ``_timer`` and ``_applies`` themselves, on a snapshot of this shape whose
    moments are stand-ins (-1 to -4, in ``_SINCES`` order): the stand-in a timer
    comes back with names the moment it runs from."""
    supervised, no_turn, approval, critical, *unset = shape
    moments = {name: None if missing else -1.0 - index for index, (name, missing) in enumerate(zip(_SINCES, unset, strict=True))}
    probe = ThreadSnapshot(thread_id=thread_id, supervised=supervised, active_turn_id=None if no_turn else "",
                           approval_pending=approval, critical_tool=critical, **moments)
    timers, failures, goals, budgets = [], [], [], []
    for rule in ruleset.rules:
        if _applies(rule, probe):
            if isinstance(rule.condition, RepeatedFailure):
                failures.append((rule.condition.count, rule))
                continue
            if isinstance(rule.condition, GoalBudgetLimited):
                goals.append(rule)
                continue
            if isinstance(rule.condition, Budget):
                budgets.append(rule)
                continue
            timer = _timer(rule.condition, probe)
            if timer is not None:
                timers.append((int(-timer.since) - 1, timer.limit, rule))
    return _Plan(tuple(timers), tuple(failures), tuple(goals), tuple(budgets))


def _evaluated(ruleset: RuleSet, snapshot: ThreadSnapshot, now: float) -> list[Rule]:
    return [rule for rule in ruleset.rules if _applies(rule, snapshot) and rule.in_force(now)]


def _applies(rule: Rule, snapshot: ThreadSnapshot) -> bool:
    """An evaluated rule for this thread; Codex's ephemeral housekeeping threads (the
    TUI's title generation) are no one's work: no rule looks at them."""
    return (snapshot.supervised and rule.status in EVALUATED_STATUSES
            and matches_thread(rule.threads, snapshot.thread_id))


def _finding(rule: Rule, snapshot: ThreadSnapshot, observation: _Observation) -> Finding:
    turn_id = snapshot.active_turn_id
    key_turn = turn_id if observation.per_turn else None
    fields = {"thread_id": snapshot.thread_id, "turn_id": turn_id or "none", **observation.fields}
    return Finding(
        rule_id=rule.id,
        rule_version=rule.version,
        status=rule.status,
        action=rule.action,
        thread_id=snapshot.thread_id,
        turn_id=turn_id,
        key=f"{rule.id}:{snapshot.thread_id if observation.per_thread else '*'}:{key_turn or '-'}:{observation.instance}",
        finding=observation.finding,
        text=render(rule.text, fields) if rule.text is not None else None,
        ack_deadline=rule.ack_deadline,
        verify=rule.verify,
        detail=observation.detail,
    )


def _observe(condition: AnyCondition, snapshot: ThreadSnapshot, now: float, prices) -> Iterator[_Observation]:
    if isinstance(condition, Budget):
        yield from _budget(condition, snapshot, prices)
        return
    if isinstance(condition, RepeatedFailure):
        yield from _repeated_failures(condition.count, snapshot)
        return
    if isinstance(condition, GoalBudgetLimited):
        yield from _goal_budget_limited(snapshot)
        return
    timer = _timer(condition, snapshot)
    if timer is not None and now - timer.since >= timer.limit:
        lasted = now - timer.since
        yield _Observation(
            instance=f"{timer.instance}:{timer.since!r}",
            finding=f"{timer.what} for {format_duration(lasted, parts=2)}",
            fields={timer.field: format_duration(lasted, parts=2)},
            detail={"seconds": lasted, "since": timer.since, "threshold_seconds": timer.limit},
        )


def _timer(condition: AnyCondition, snapshot: ThreadSnapshot) -> _Timer | None:
    """What the time-based conditions watch, when it is lasting; None otherwise
    (and always for ``repeated_failure`` and ``intent_overdue``)."""
    match condition:
        case TurnQuiet(for_seconds=limit):
            # A quiet critical tool or a pending approval is not a stall.
            if snapshot.active_turn_id is None or snapshot.critical_tool or snapshot.approval_pending:
                return None
            since = snapshot.last_progress_at if snapshot.last_progress_at is not None else snapshot.active_turn_started_at
            what, instance, field = f"turn {snapshot.active_turn_id} made no progress", "quiet-since", "quiet_for"
        case ApprovalWaiting(for_seconds=limit) if snapshot.approval_pending:
            since, what, instance, field = snapshot.approval_pending_since, "approval pending", "approval-since", "waiting_for"
        case CriticalToolRunning(for_seconds=limit) if snapshot.critical_tool:
            since, what = snapshot.critical_tool_since, "critical tool running, left alone,"
            instance, field = "critical-since", "running_for"
        case TurnLong(for_seconds=limit) if snapshot.active_turn_id is not None:
            since, what = snapshot.active_turn_started_at, f"turn {snapshot.active_turn_id} running"
            instance, field = "turn-long", "running_for"
        case _:  # nothing lasting, or a condition that is not about time
            return None
    if since is None:
        return None
    return _Timer(instance=instance, what=what, field=field, since=since, limit=limit)


def _repeated_failures(limit: int, snapshot: ThreadSnapshot) -> Iterator[_Observation]:
    """One observation per command (arguments digest) that failed ``limit`` times."""
    for digest, (count, tool, exit_code) in sorted(snapshot.failures.items()):
        if count >= limit:
            shown_exit = str(exit_code) if exit_code is not None else "unknown"
            yield _Observation(
                instance=f"failure:{digest}",
                finding=f"{tool or 'a command'} failed {count} times with the same arguments (last exit {shown_exit})",
                fields={
                    "count": str(count),
                    "tool": tool or "the failing command",
                    "exit_code": shown_exit,
                    "args_digest": digest,
                },
                detail={"count": count, "tool": tool, "exit_code": exit_code, "args_digest": digest, "threshold": limit},
            )


def _goal_budget_limited(snapshot: ThreadSnapshot) -> Iterator[_Observation]:
    """The thread's goal reached its token budget: one observation per such change."""
    goal = snapshot.goal
    if goal is None or goal.status != GOAL_BUDGET_LIMITED:
        return
    used = "unknown" if goal.tokens_used is None else str(goal.tokens_used)
    budget = "unknown" if goal.token_budget is None else str(goal.token_budget)
    yield _Observation(
        instance=f"goal-budget-limited:{goal.changed_at!r}",
        finding=f"goal reached its token budget ({used} of {budget} tokens); Codex starts no more turns for it",
        fields={"token_budget": budget, "tokens_used": used},
        detail={"goal_status": goal.status, "token_budget": goal.token_budget, "tokens_used": goal.tokens_used,
                "time_used_seconds": goal.time_used_seconds, "goal_turn": goal.turn_id, "since": goal.changed_at},
        per_turn=False,
    )


def _budget(condition: Budget, snapshot: ThreadSnapshot, prices) -> Iterator[_Observation]:
    """The budget's crossing by the thread's figures, keyed on its scope instance and limit."""
    usage = snapshot.usage
    crossed = crossing(condition, usage, prices) if usage is not None else None
    if crossed is None:
        return
    measure, per = condition.measure, condition.per
    figure, limit = _shown(measure, crossed.figure), _shown(measure, condition.over)
    yield _Observation(
        instance=f"budget:{measure}:{per}:{crossed.instance}:{condition.over!r}",
        finding=f"{_MEASURE_NAMES[measure]} per {per} ({crossed.instance}) reached {figure}, over its limit {limit}",
        fields={"measure": measure, "figure": figure, "limit": limit, "per": per},
        detail=_budget_detail(condition, crossed, usage, snapshot),
        per_turn=False, per_thread=per != "owner",
    )


_MEASURE_NAMES = {"tokens": "tokens", "cost_usd": "cost", "context": "context used"}


def _shown(measure: str, value: float) -> str:
    if measure == "cost_usd":
        return f"${value:,.2f}"
    if measure == "context":
        return f"{value:.0%}"
    return f"{int(value):,}"


def _budget_detail(condition: Budget, crossed: Crossing, usage, snapshot: ThreadSnapshot) -> dict[str, Any]:
    """The figure that crossed, its limit and scope, and where it came from: the source
    and the ledger row of the response that crossed it; cost: the price table's date and
    the models it had no price for; a goal: Codex's own budget and count beside ours."""
    detail: dict[str, Any] = {"measure": condition.measure, "figure": crossed.figure, "limit": condition.over,
                              "per": condition.per, "instance": crossed.instance,
                              "source_kind": usage.source_kind, "usage_seq": usage.seq}
    if crossed.spent is not None:
        detail |= {"tokens": crossed.spent.tokens.total, "responses": crossed.spent.responses}
    if condition.measure == "context":
        detail |= {"last_input": usage.last_input, "context_window": usage.context_window}
    if condition.measure == "cost_usd":
        # a comma-separated string, as a report's detail holds scalars only (a list made
        # the ledger row one no reader could decode)
        detail |= {"price_date": crossed.price_date, "unpriced_models": ",".join(crossed.unpriced)}
    goal = snapshot.goal
    if condition.per == "goal" and goal is not None:
        detail |= {"goal_token_budget": goal.token_budget, "goal_tokens_used": goal.tokens_used}
    return detail


def render(template: str, fields: dict[str, str]) -> str:
    """Fill ``{name}`` placeholders from ``fields``; anything else stays as written
    (rule files are checked at load, but a template must never run code or raise)."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        return template
    rendered: list[str] = []
    for literal, name, _, _ in parts:
        rendered.append(literal)
        if name is not None:
            rendered.append(fields.get(name, "{" + name + "}"))
    return "".join(rendered)
