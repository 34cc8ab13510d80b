"""Detection rules over a ThreadSnapshot: which findings, with which dedup keys."""

from __future__ import annotations

import datetime

import pytest
from msgspec.structs import replace

from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.rules.decision import Action
from tillerman.rules.detect import Finding, detect, next_due, render
from tillerman.rules.files import default_ruleset
from tillerman.rules.ruleset import (
    AnyCondition,
    ApprovalWaiting,
    CriticalToolRunning,
    IntentOverdue,
    RepeatedFailure,
    Rule,
    RuleSet,
    TurnLong,
    TurnQuiet,
    build_ruleset,
)

T0 = 1_800_000_000.0  # 2027-01-15, before every review and expiry date below
MINUTE = 60.0

#: Turn u1 of thread t1 started at T0 and last made progress at T0 + 1m.
ACTIVE = ThreadSnapshot(
    thread_id="t1",
    steerable=True,
    active_turn_id="u1",
    active_turn_started_at=T0,
    turn_states={"u1": "active"},
    last_progress_at=T0 + MINUTE,
)


def rule(condition: AnyCondition, **fields: object) -> Rule:
    defaults: dict[str, object] = {
        "id": "r",
        "version": 1,
        "status": "active",
        "action": Action.REPORT_OVERDUE,
        "owner": "me",
        "review_by": datetime.date(2027, 6, 1),
    }
    return Rule(condition=condition, **(defaults | fields))


def only(*rules: Rule) -> RuleSet:
    return build_ruleset(rules, ())


QUIET = only(rule(TurnQuiet(for_seconds=10 * MINUTE), id="stall", text="Turn {turn_id} quiet for {quiet_for}."))


# -- turn_quiet -----------------------------------------------------------------------------


def test_quiet_turn_is_found_with_every_field() -> None:
    now = T0 + 13 * MINUTE
    assert detect(ACTIVE, now, QUIET) == [
        Finding(
            rule_id="stall",
            rule_version=1,
            status="active",
            action=Action.REPORT_OVERDUE,
            thread_id="t1",
            turn_id="u1",
            key=f"stall:t1:u1:quiet-since:{T0 + MINUTE!r}",
            finding="turn u1 made no progress for 12m",
            text="Turn u1 quiet for 12m.",
            ack_deadline=None,
            detail={"seconds": 12 * MINUTE, "since": T0 + MINUTE, "threshold_seconds": 10 * MINUTE},
        )
    ]


def test_quiet_turn_below_the_threshold_is_not_a_finding() -> None:
    assert detect(ACTIVE, T0 + 10 * MINUTE, QUIET) == []


def test_quiet_turn_counts_from_the_turn_start_without_progress() -> None:
    snapshot = replace(ACTIVE, last_progress_at=None)
    (finding,) = detect(snapshot, T0 + 10 * MINUTE, QUIET)
    assert finding.key == f"stall:t1:u1:quiet-since:{T0!r}"


@pytest.mark.parametrize(
    "healthy",
    [
        pytest.param({"critical_tool": True, "critical_tool_since": T0}, id="a quiet critical tool (a build)"),
        pytest.param({"approval_pending": True, "approval_pending_since": T0}, id="a pending approval"),
        pytest.param({"active_turn_id": None, "turn_states": {"u1": "completed"}}, id="no active turn"),
        pytest.param({"active_turn_started_at": None, "last_progress_at": None}, id="no time known"),
    ],
)
def test_quiet_turn_is_not_a_stall_when(healthy: dict[str, object]) -> None:
    assert detect(replace(ACTIVE, **healthy), T0 + 60 * MINUTE, QUIET) == []


def test_the_same_quiet_period_keeps_its_key_and_progress_starts_a_new_one() -> None:
    (first,) = detect(ACTIVE, T0 + 12 * MINUTE, QUIET)
    (later,) = detect(ACTIVE, T0 + 30 * MINUTE, QUIET)
    assert later.key == first.key and later.finding != first.finding
    moved_on = replace(ACTIVE, last_progress_at=T0 + 20 * MINUTE)
    (next_stall,) = detect(moved_on, T0 + 31 * MINUTE, QUIET)
    assert next_stall.key != first.key


# -- repeated_failure -----------------------------------------------------------------------

REPEATED = only(
    rule(
        RepeatedFailure(count=3),
        id="repeated-failure",
        version=3,
        action=Action.STEER,
        text="Stop re-running {tool}: it failed {count} times (exit {exit_code}).",
        ack_deadline=120.0,
    )
)


def test_repeated_failure_proposes_a_steer_per_failing_command() -> None:
    snapshot = replace(ACTIVE, failures={"sha256:b": (3, "pytest", 2), "sha256:a": (4, None, None), "sha256:c": (2, "make", 1)})
    findings = detect(snapshot, T0, REPEATED)
    assert [(f.key, f.text, f.ack_deadline) for f in findings] == [
        ("repeated-failure:t1:u1:failure:sha256:a", "Stop re-running the failing command: it failed 4 times (exit unknown).", 120.0),
        ("repeated-failure:t1:u1:failure:sha256:b", "Stop re-running pytest: it failed 3 times (exit 2).", 120.0),
    ]
    assert findings[1].finding == "pytest failed 3 times with the same arguments (last exit 2)"
    assert findings[1].detail == {"count": 3, "tool": "pytest", "exit_code": 2, "args_digest": "sha256:b", "threshold": 3}
    assert {(f.action, f.rule_version) for f in findings} == {(Action.STEER, 3)}


def test_repeated_failure_key_survives_more_failures() -> None:
    three = replace(ACTIVE, failures={"sha256:b": (3, "pytest", 2)})
    five = replace(ACTIVE, failures={"sha256:b": (5, "pytest", 1)})
    assert detect(three, T0, REPEATED)[0].key == detect(five, T0 + 90, REPEATED)[0].key


# -- approval, critical tool, long turn, overdue intents --------------------------------


def test_approval_waiting_only_reports() -> None:
    ruleset = only(rule(ApprovalWaiting(for_seconds=5 * MINUTE), id="approval-wait"))
    waiting = replace(ACTIVE, approval_pending=True, approval_pending_since=T0 + 2 * MINUTE)
    assert detect(waiting, T0 + 6 * MINUTE, ruleset) == []
    (finding,) = detect(waiting, T0 + 7 * MINUTE, ruleset)
    assert (finding.action, finding.finding, finding.key) == (
        Action.REPORT_OVERDUE,
        "approval pending for 5m",
        f"approval-wait:t1:u1:approval-since:{T0 + 2 * MINUTE!r}",
    )


def test_builtin_approval_rule_never_steers_or_interrupts() -> None:
    waiting = replace(ACTIVE, approval_pending=True, approval_pending_since=T0)
    findings = detect(waiting, T0 + 3 * 3600, default_ruleset())
    assert [f.rule_id for f in findings] == ["approval-wait"]
    assert findings[0].action is Action.REPORT_OVERDUE


def test_quiet_critical_tool_is_observed() -> None:
    ruleset = only(rule(CriticalToolRunning(for_seconds=15 * MINUTE), id="quiet-critical-tool", action=Action.OBSERVE))
    building = replace(ACTIVE, critical_tool=True, critical_tool_since=T0)
    (finding,) = detect(building, T0 + 20 * MINUTE, ruleset)
    assert (finding.action, finding.finding) == (Action.OBSERVE, "critical tool running, left alone, for 20m")
    assert detect(replace(building, critical_tool=False), T0 + 20 * MINUTE, ruleset) == []


def test_long_turn() -> None:
    ruleset = only(rule(TurnLong(for_seconds=3600), id="long"))
    (finding,) = detect(ACTIVE, T0 + 3 * 3600, ruleset)
    assert (finding.finding, finding.key) == ("turn u1 running for 3h", f"long:t1:u1:turn-long:{T0!r}")
    assert detect(ACTIVE, T0 + 3599, ruleset) == []


def test_intent_overdue_is_left_to_the_policy() -> None:
    assert detect(ACTIVE, T0 + 86400, only(rule(IntentOverdue()))) == []


def test_builtin_rules_on_a_stuck_turn() -> None:
    stuck = replace(ACTIVE, failures={"sha256:a": (3, "pytest", 1)})
    findings = detect(stuck, T0 + 11 * MINUTE, default_ruleset())
    assert [(f.rule_id, f.action) for f in findings] == [("repeated-failure", Action.STEER), ("stall", Action.REPORT_OVERDUE)]


# -- lifecycle and filters --------------------------------------------------------------------


@pytest.mark.parametrize(("status", "found"), [("active", True), ("shadow", True), ("proposed", False), ("retired", False)])
def test_rule_status(status: str, found: bool) -> None:
    findings = detect(ACTIVE, T0 + 13 * MINUTE, only(replace(QUIET.rules[0], status=status)))
    assert [f.status for f in findings] == ([status] if found else [])


def test_rule_past_its_expiry_date_finds_nothing() -> None:
    day = datetime.datetime.fromtimestamp(T0, datetime.UTC).date()
    expiring = replace(QUIET.rules[0], expires=day + datetime.timedelta(days=1))
    assert len(detect(ACTIVE, T0 + 13 * MINUTE, only(expiring))) == 1
    assert detect(ACTIVE, T0 + 86400 + 13 * MINUTE, only(expiring)) == []


@pytest.mark.parametrize(("threads", "found"), [("*", True), ("t1", True), (("t0", "t1"), True), ("t2", False), ((), False)])
def test_rule_thread_filter(threads: str | tuple[str, ...], found: bool) -> None:
    filtered = replace(QUIET.rules[0], threads=threads)
    assert bool(detect(ACTIVE, T0 + 13 * MINUTE, only(filtered))) is found


def test_findings_are_ordered_and_pure() -> None:
    snapshot = replace(ACTIVE, failures={"sha256:a": (3, "pytest", 1)})
    ruleset = build_ruleset((*QUIET.rules, *REPEATED.rules), ())
    reversed_ruleset = build_ruleset((*REPEATED.rules, *QUIET.rules), ())
    first = detect(snapshot, T0 + 13 * MINUTE, ruleset)
    assert [f.rule_id for f in first] == ["repeated-failure", "stall"]
    assert detect(snapshot, T0 + 13 * MINUTE, reversed_ruleset) == first


# -- next_due: where replay's virtual clock jumps ----------------------------------------


def test_next_due_is_the_earliest_pending_timer() -> None:
    ruleset = build_ruleset(
        (*QUIET.rules, rule(TurnLong(for_seconds=3600), id="long"), *REPEATED.rules), ()
    )
    assert next_due(ACTIVE, T0 + MINUTE, ruleset) == T0 + 11 * MINUTE
    (stall,) = detect(ACTIVE, T0 + 11 * MINUTE, QUIET)  # it is due exactly then
    assert stall.rule_id == "stall"
    assert next_due(ACTIVE, T0 + 11 * MINUTE, ruleset) == T0 + 3600


def test_next_due_ignores_what_cannot_fire() -> None:
    building = replace(ACTIVE, critical_tool=True, critical_tool_since=T0)
    assert next_due(building, T0, QUIET) is None  # a quiet build is not a stall
    assert next_due(ACTIVE, T0, REPEATED) is None  # failures are events, not timers
    assert next_due(ACTIVE, T0, only(replace(QUIET.rules[0], status="retired"))) is None
    assert next_due(ACTIVE, T0 + 11 * MINUTE, QUIET) is None  # already due: detect has it


# -- helpers ------------------------------------------------------------------------------------


def test_render_fills_only_plain_placeholders() -> None:
    fields = {"tool": "pytest"}
    assert render("Stop {tool} {{now}}", fields) == "Stop pytest {now}"
    assert render("{tool.__class__} {missing}", fields) == "{tool.__class__} {missing}"
    assert render("unbalanced {", fields) == "unbalanced {"
