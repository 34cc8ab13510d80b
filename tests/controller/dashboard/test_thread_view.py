"""One thread's page: turns, calls, approvals, findings, intents with their journeys,
reviews, usage, and paging."""

from __future__ import annotations

import datetime as dt

import pytest

from tillerman.controller.dashboard.fleet import Sightings, fleet_row, fleet_rows
from tillerman.controller.dashboard.thread_view import MAX_LIMIT, thread_view
from tillerman.controller.report.fold import fold_facts
from tillerman.controller.report.timeline import timeline_data
from tillerman.controller.report.usage import UsageReport
from tillerman.ledger import events as ev
from tillerman.ledger.usage import Tokens
from tillerman.rules.prices import bundled_table

from tests.controller.dashboard.test_fleet import NOW, TODAY, UUID, entries, intent, started, turn


def view(*facts: tuple, page: int = 0, limit: int = 50, thread: str = UUID):
    found = entries(*facts)
    usage = UsageReport(bundled_table(), by="session", tz=dt.timezone.utc, since=TODAY, until=TODAY)
    usage.add_all(e.envelope for e in found)
    return thread_view(fold_facts(found), Sightings().fold(found).threads, usage, thread, NOW, page=page, limit=limit)


def report(finding: str, **detail) -> ev.Report:
    return ev.Report(thread_id=UUID, turn_id="t1", rule_id="r", rule_version=1, finding=finding, detail=detail)


def session() -> list[tuple]:
    i = intent(UUID)
    return [
        (started(project="shop"), NOW - 100), (turn(), NOW - 90),
        (ev.ItemStarted(thread_id=UUID, turn_id="t1", item_id="c1", item_type="commandExecution", tool="make"),
         NOW - 80),
        (ev.ItemCompleted(thread_id=UUID, turn_id="t1", item_id="c1", item_type="commandExecution", exit_code=2),
         NOW - 70),
        (ev.ApprovalRequested(thread_id=UUID, turn_id="t1", item_id="c2"), NOW - 60),
        (report("turn t1 made no progress for 5m"), NOW - 50),
        (report("make failed 3 times with the same arguments (last exit 2)"), NOW - 49),
        (report("tokens per turn (t1) reached 900, over its limit 800", usage_seq=9), NOW - 48),
        (ev.IntentProposed(intent=i), NOW - 47),
        (ev.DecisionRecorded(intent_id=i.id, action="dispatch", reason="policy allows"), NOW - 46),
        (ev.IntentTransition(intent_id=i.id, from_state="proposed", to_state="acknowledged", reason="echo"), NOW - 45),
        (ev.ReviewPending(thread_id=UUID, checkpoint_id="k1", checkpoint="before_dispatch", reviewer="rev",
                          intent_id=i.id), NOW - 44),
        (ev.ReviewCommitted(thread_id=UUID, checkpoint_id="k1", checkpoint="before_dispatch", reviewer="rev",
                            intent_id=i.id, outcome="accepted", disposition="ready_for_existing_gate",
                            cost_usd=0.01), NOW - 43),
        (ev.Usage(thread_id=UUID, turn_id="t1", source_kind="codex_rollout", model="gpt-5",
                  tokens=Tokens(input=100, output=10)), NOW - 42),
        (ev.Usage(thread_id=UUID, turn_id="t1", source_kind="codex_rollout", model="no-such-model",
                  tokens=Tokens(input=50, output=5)), NOW - 41),
        (turn("other", "o1"), NOW - 40),  # another thread's: not on this page
    ]


def test_the_page_of_a_thread():
    page = view(*session())
    assert page.header is not None and page.header.state == "waiting" and page.header.name == "shop"
    assert [(t.turn_id, t.state, t.started_at) for t in page.turns] == [("t1", "open", NOW - 90)]
    assert [(c.tool, c.status, c.exit_code) for c in page.tool_calls] == [("make", "completed", 2)]
    assert [(a.item_id, a.since) for a in page.approvals] == [("c2", NOW - 60)]
    assert [f.kind for f in page.findings] == ["budget", "loop", "stall"]
    (row,) = page.intents
    assert (row.state, row.open) == ("acknowledged", False)  # a steer with no check ends there
    assert [(h.kind, h.state, h.reason, h.at) for h in row.journey] == [
        ("proposed", "proposed", "owner:unknown", NOW - 47), ("decision", "dispatch", "policy allows", NOW - 46),
        ("transition", "acknowledged", "echo", NOW - 45)]
    (review,) = page.reviews
    assert (review.reviewer, review.outcome, review.disposition, review.asked_at) == (
        "rev", "accepted", "ready_for_existing_gate", NOW - 44)
    timeline = timeline_data(fold_facts(entries(*session())), thread_id=UUID)  # what the page's timeline link draws
    assert timeline["threads"] == [UUID] and len(timeline["turns"]) == 1


def test_retained_commands_and_agent_messages_are_shown_newest_first_and_paged():
    facts = [(started(), NOW - 100), (turn(), NOW - 90),
             (ev.ItemStarted(thread_id=UUID, turn_id="t1", item_id="c1", item_type="commandExecution",
                             tool="exec_command", command="make test"), NOW - 80),
             (ev.ItemStarted(thread_id=UUID, turn_id="t1", item_id="c2", item_type="fileChange"), NOW - 79),
             (ev.AgentMessage(thread_id=UUID, turn_id="t1", digest="d", size=5, text="first"), NOW - 70),
             (ev.AgentMessage(thread_id=UUID, turn_id="t1", digest="d", size=6), NOW - 65),  # not retained
             (ev.AgentMessage(thread_id=UUID, turn_id="t1", digest="d", size=6, text="second"), NOW - 60),
             (ev.AgentMessage(thread_id="other", turn_id="o1", digest="d", size=5, text="other"), NOW - 55)]
    page = view(*facts)
    assert [(c.tool, c.command) for c in page.tool_calls] == [("file change", None), ("exec_command", "make test")]
    assert [(m.turn_id, m.at, m.text) for m in page.messages] == [("t1", NOW - 60, "second"), ("t1", NOW - 70, "first")]
    assert page.counts["messages"] == 2
    assert [m.text for m in view(*facts, page=1, limit=1).messages] == ["first"]


def test_usage_by_model_and_turn_with_an_unknown_price():
    usage = view(*session()).usage
    assert usage.tokens == 165 and usage.cost_usd is None  # one response has no price
    assert [(line.key, line.tokens, line.cost_usd is None) for line in usage.by_model] == [
        ("gpt-5", 110, False), ("no-such-model", 55, True)]
    assert [(line.key, line.tokens) for line in usage.by_turn] == [("t1", 165)]
    assert [line.key for line in usage.by_day] == [TODAY]


def many_turns(n: int) -> list[tuple]:
    out = [(started(), NOW - 10_000)]
    for k in range(n):
        out += [(turn(turn_id=f"t{k}"), NOW - 5000 + 10 * k),
                (ev.TurnCompleted(thread_id=UUID, turn_id=f"t{k}"), NOW - 4995 + 10 * k)]
    return out


PAGE_CASES = {
    "first page, newest first": (0, 3, ["t6", "t5", "t4"]),
    "second page": (1, 3, ["t3", "t2", "t1"]),
    "the last, short": (2, 3, ["t0"]),
    "past the end": (3, 3, []),
    "a limit past the most is held to it": (0, 10 * MAX_LIMIT, [f"t{k}" for k in range(6, -1, -1)]),
}


@pytest.mark.parametrize("case", PAGE_CASES)
def test_lists_are_paged(case):
    page, limit, expected = PAGE_CASES[case]
    shown = view(*many_turns(7), page=page, limit=limit)
    assert [t.turn_id for t in shown.turns] == expected
    assert shown.counts["turns"] == 7 and shown.limit == min(limit, MAX_LIMIT)


def test_a_thread_never_seen_is_an_empty_page():
    shown = view(*session(), thread="nobody")
    assert shown.header is None and shown.turns == () and shown.usage.tokens == 0


def test_the_header_is_the_fleets_row_built_alone():
    found = entries(*session(), (started("other", project="api"), NOW - 30),
                    (ev.IntentProposed(intent=intent("other", ack_deadline=NOW - 1)), NOW - 29))
    usage = UsageReport(bundled_table(), by="session", tz=dt.timezone.utc, since=TODAY, until=TODAY)
    usage.add_all(e.envelope for e in found)
    projection, seen = fold_facts(found).projection, Sightings().fold(found).threads
    rows = fleet_rows(projection, usage, NOW, seen)
    assert len(rows) == 2 and rows[1].overdue == 1
    assert [fleet_row(projection, usage, NOW, seen, r.thread_id) for r in rows] == rows
    assert fleet_row(projection, usage, NOW, seen, "nobody") is None


def test_a_finding_names_its_report_event_for_a_label():
    found = entries(*session())
    reports = {e.seq: e.envelope.event_id for e in found if isinstance(e.envelope.event, ev.Report)}
    assert {(f.seq, f.event_id) for f in view(*session()).findings} == set(reports.items())
