"""The fleet's rows: each state, the order, the names, usage today, filters and sorting."""

from __future__ import annotations

import datetime as dt

import pytest

from tillerman.controller.dashboard.fleet import (
    RUNNING_LENGTH, STATES, Sightings, filter_rows, fleet_rows, sort_rows,
)
from tillerman.controller.report.usage import UsageReport
from tillerman.ledger import events as ev
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.intents import Intent, text_digest
from tillerman.ledger.projections import Projection
from tillerman.ledger.usage import Tokens
from tillerman.rules.prices import bundled_table

NOW = 1_780_000_000.0  # 2026-05-28 UTC
TODAY = dt.datetime.fromtimestamp(NOW, dt.timezone.utc).strftime("%Y-%m-%d")
UUID = "019a0000-1111-2222-3333-444455556666"


def entries(*facts: tuple) -> list[Entry]:
    """(event, at) or (event, at, source) -> ledger entries in that order."""
    out = []
    for seq, fact in enumerate(facts, 1):
        event, at, source = (*fact, "file:x") if len(fact) == 2 else fact
        out.append(Entry(seq=seq, prev_hash="", hash="",
                         envelope=Envelope(event_id=str(seq), event=event, source=source, at=at)))
    return out


def started(thread: str = UUID, fmt: str = "codex-rollout", **fields) -> ev.ThreadStarted:
    return ev.ThreadStarted(thread_id=thread, source_format=fmt, **fields)


def intent(thread: str, mode: str = "steer", *, ack_deadline: float = NOW + 60) -> Intent:
    return Intent(id=f"i-{thread}-{mode}", thread_id=thread, mode=mode, text="look", text_digest=text_digest("look"),
                  created_at=NOW - 100, ack_deadline=ack_deadline, expires_at=NOW + 1000,
                  expected_turn_id="t1" if mode == "steer" else None)


def rows_of(found: list[Entry], now: float = NOW):
    projection = Projection().fold(found)
    usage = UsageReport(bundled_table(), by="session", tz=dt.timezone.utc, since=TODAY, until=TODAY)
    usage.add_all(e.envelope for e in found)
    return fleet_rows(projection, usage, now, Sightings().fold(found).threads)


def row_of(*facts: tuple, now: float = NOW):
    (row,) = rows_of(entries(*facts), now)
    return row


def turn(thread: str = UUID, turn_id: str = "t1") -> ev.TurnStarted:
    return ev.TurnStarted(thread_id=thread, turn_id=turn_id)


STATE_CASES = {
    "working": ([(started(), NOW - 50), (turn(), NOW - 40)], NOW - 40),
    "waiting": ([(started(), NOW - 50), (turn(), NOW - 40),
                 (ev.ApprovalRequested(thread_id=UUID, turn_id="t1", item_id="c1"), NOW - 30)], NOW - 30),
    "stalled": ([(started(), NOW - 5000), (turn(), NOW - 4000)], NOW - 4000),
    "stalled, as a rule reported": (
        [(started(), NOW - 50), (turn(), NOW - 40),
         (ev.Report(thread_id=UUID, turn_id="t1", rule_id="quiet", rule_version=1,
                    finding="turn t1 made no progress for 30s"), NOW - 10)], NOW - 40),
    "working, moving again after a reported stall": (
        [(started(), NOW - 50), (turn(), NOW - 40),
         (ev.Report(thread_id=UUID, turn_id="t1", rule_id="quiet", rule_version=1,
                    finding="turn t1 made no progress for 30s"), NOW - 10),
         (ev.AgentMessage(thread_id=UUID, turn_id="t1", digest="d", size=1), NOW - 5)], NOW - 40),
    "idle": ([(started(), NOW - 50), (turn(), NOW - 40), (ev.TurnCompleted(thread_id=UUID, turn_id="t1"), NOW - 20)],
             NOW - 20),
    "stopped": ([(started(), NOW - 50), (turn(), NOW - 40),
                 (ev.IntentProposed(intent=intent(UUID, "stop")), NOW - 30),
                 (ev.IntentTransition(intent_id=f"i-{UUID}-stop", from_state="proposed",
                                      to_state="acknowledged", reason="interrupted"), NOW - 28),
                 (ev.TurnCompleted(thread_id=UUID, turn_id="t1", status="interrupted"), NOW - 28)], NOW - 28),
    "done": ([(started(fmt="appserver"), NOW - 50, "appserver"), (turn(), NOW - 40, "appserver"),
              (ev.StatusChanged(thread_id=UUID, status="notLoaded"), NOW - 5, "appserver")], NOW - 5),
    "done, as a Claude Code session ended with a turn open": (
        [(started(fmt="claude-hooks"), NOW - 50, "hooks"), (turn(), NOW - 40, "hooks"),
         (ev.TurnCompleted(thread_id=UUID, turn_id="t1", status="interrupted"), NOW - 6, "hooks"),
         (ev.StatusChanged(thread_id=UUID, status=ev.SESSION_ENDED), NOW - 6, "hooks")], NOW - 6),
    "done, whatever a source read late tells of turns before the end": (
        [(started(fmt="claude-hooks"), NOW - 50, "hooks"),
         (ev.StatusChanged(thread_id=UUID, status=ev.SESSION_ENDED), NOW - 6, "hooks"),
         (turn(turn_id="t0"), NOW - 45, "file:t"), (ev.TurnCompleted(thread_id=UUID, turn_id="t0"), NOW - 44, "file:t")],
        NOW - 6),
    "working, on a resumed session after its end": (
        [(started(fmt="claude-hooks"), NOW - 50, "hooks"),
         (ev.StatusChanged(thread_id=UUID, status=ev.SESSION_ENDED), NOW - 30, "hooks"),
         (turn(turn_id="t2"), NOW - 10, "hooks")], NOW - 10),
    "idle, on a Codex thread loaded again": (
        [(started(fmt="appserver"), NOW - 50, "appserver"),
         (ev.StatusChanged(thread_id=UUID, status="notLoaded"), NOW - 30, "appserver"),
         (ev.StatusChanged(thread_id=UUID, status="idle"), NOW - 10, "appserver")], NOW - 10),
}


@pytest.mark.parametrize("case", STATE_CASES)
def test_each_state_and_since_when(case):
    facts, since = STATE_CASES[case]
    row = row_of(*facts)
    assert (row.state, row.state_since) == (case.split(",")[0], since)


def test_the_order_puts_what_needs_a_person_first():
    """One thread per state, and an idle one with an overdue intent: waiting, stalled,
    overdue, working, idle, stopped, done; within a state the longest in it first."""
    found = []
    for state, (facts, _) in STATE_CASES.items():
        thread = state.replace(" ", "-").replace(",", "")
        for fact in facts:
            event = fact[0]
            if isinstance(event, ev.IntentProposed):
                event = ev.IntentProposed(intent=intent(thread, "stop"))
            elif isinstance(event, ev.IntentTransition):
                event = ev.IntentTransition(intent_id=f"i-{thread}-stop", from_state=event.from_state,
                                            to_state=event.to_state, reason=event.reason)
            elif event.thread_id is not None:
                event = type(event)(**{**{f: getattr(event, f) for f in event.__struct_fields__}, "thread_id": thread})
            found.append((event, *fact[1:]))
    found += [(started("late"), NOW - 60), (ev.IntentProposed(intent=intent("late", ack_deadline=NOW - 1)), NOW - 59)]
    rows = rows_of(entries(*found))
    assert [(r.thread_id, r.state) for r in rows] == [
        ("waiting", "waiting"), ("stalled", "stalled"), ("stalled-as-a-rule-reported", "stalled"),
        ("late", "idle"), ("working", "working"), ("working-moving-again-after-a-reported-stall", "working"),
        ("working-on-a-resumed-session-after-its-end", "working"),
        ("idle", "idle"), ("idle-on-a-Codex-thread-loaded-again", "idle"), ("stopped", "stopped"),
        ("done-as-a-Claude-Code-session-ended-with-a-turn-open", "done"),
        ("done-whatever-a-source-read-late-tells-of-turns-before-the-end", "done"), ("done", "done")]
    late = rows[3]
    assert (late.open_intents, late.overdue) == (1, 1)
    assert {r.state for r in rows} == set(STATES)


NAME_CASES = {
    "title, before the first prompt": (
        [(started(cwd="/home/a/shop", project="shop"), NOW - 9),
         (ev.UserMessage(thread_id=UUID, turn_id="t1", digest="d", size=9, text="Fix it pl"), NOW - 8),
         (ev.ThreadNamed.of(UUID, "Checkout test"), NOW - 7)], "Checkout test"),
    "the latest title": ([(started(), NOW - 9), (ev.ThreadNamed.of(UUID, "Old"), NOW - 8),
                          (ev.ThreadNamed.of(UUID, "New"), NOW - 7)], "New"),
    "a title cleared: the project again": (
        [(started(project="shop"), NOW - 9), (ev.ThreadNamed.of(UUID, "Old"), NOW - 8),
         (ev.ThreadNamed.of(UUID, None), NOW - 7)], "shop"),
    "first prompt (payloads retained)": (
        [(started(cwd="/home/a/shop", project="shop"), NOW - 9),
         (ev.UserMessage(thread_id=UUID, turn_id="t1", digest="d", size=40,
                         text="Fix the   flaky checkout test\nplease"), NOW - 8)],
        "Fix the flaky checkout test please"),
    "project and branch": ([(started(project="shop", git_branch="main"), NOW - 9)], "shop (main)"),
    "project from the cwd": ([(started(cwd="/home/a/shop"), NOW - 9)], "shop"),
    "digest only: agent, short id and time": (
        [(started(cwd_digest="abc"), NOW - 9)], "codex 019a0000 2026-05-28T20:26"),
    "nothing but events": ([(turn(), NOW - 9)], "thread 019a0000 2026-05-28T20:26"),
}


@pytest.mark.parametrize("case", NAME_CASES)
def test_a_name_a_person_recognises_never_a_bare_id(case):
    facts, name = NAME_CASES[case]
    row = row_of(*facts)
    assert row.name == name
    assert row.name != UUID


def test_a_long_first_prompt_is_shortened():
    row = row_of((started(), NOW - 9), (ev.UserMessage(thread_id=UUID, digest="d", size=200, text="x" * 200), NOW))
    assert len(row.name) == 60 and row.name.endswith("…")


SOURCE_CASES = {
    "codex live outranks its rollout": ([("codex-rollout", "file:r"), ("appserver", "appserver")],
                                        ("codex", "codex live")),
    "claude hooks outrank the transcript": ([("claude-transcript", "file:t"), ("claude-hooks", "hooks")],
                                            ("claude", "claude hooks")),
    "and stay so when the transcript comes later": ([("claude-hooks", "hooks"), ("claude-transcript", "file:t")],
                                                    ("claude", "claude hooks")),
    "the wrapper": ([("claude-stream-json", "claude-wrapper")], ("claude", "claude wrapper")),
}


@pytest.mark.parametrize("case", SOURCE_CASES)
def test_agent_and_source(case):
    sources, expected = SOURCE_CASES[case]
    row = row_of(*[(started(fmt=fmt), NOW - 9 + i, source) for i, (fmt, source) in enumerate(sources)])
    assert (row.agent, row.source) == expected


def usage(model: str, at: float, total: int) -> ev.Usage:
    return ev.Usage(thread_id=UUID, turn_id="t1", source_kind="codex_rollout", model=model, context_window=1000,
                    tokens=Tokens(input=300, output=20), total=Tokens(input=total, output=20 * total // 300))


def test_usage_today_context_and_the_running_tool():
    row = row_of((started(), NOW - 90_000), (turn(), NOW - 90_000), (usage("gpt-5", NOW - 90_000, 300), NOW - 90_000),
                 (usage("gpt-5", NOW - 20, 600), NOW - 20),
                 (ev.ItemStarted(thread_id=UUID, turn_id="t1", item_id="c1", item_type="commandExecution",
                                 tool="pytest"), NOW - 10))
    assert row.tokens_today == 320  # yesterday's response is not today's
    assert row.cost_today_usd is not None and row.cost_today_usd > 0
    assert row.context_use == pytest.approx(0.3)
    assert (row.running_tool, row.running_since) == ("pytest", NOW - 10)
    assert row.last_event == "item started"


LONG = "pytest " + "-k x " * 40


@pytest.mark.parametrize(("fields", "shown"), [
    ({"command": "pytest -x\nsecond line", "tool": "exec_command"}, "pytest -x"),  # kept: its first line
    ({"command": LONG}, LONG[:RUNNING_LENGTH - 1] + "…"),
    ({"tool": "Read"}, "Read"),  # no command kept: the tool
    ({}, "command"),  # neither: the type in words, not camelCase
    ({"item_type": "fileChange"}, "file change"),
    ({"item_type": "mcpToolCall"}, "MCP tool call"),
], ids=["command", "long-command", "tool", "command-type", "file-change", "mcp"])
def test_the_running_column_shows_the_command_else_the_tool_else_the_type(fields, shown):
    fields = {"item_type": "commandExecution", **fields}
    row = row_of((started(), NOW - 90), (turn(), NOW - 80),
                 (ev.ItemStarted(thread_id=UUID, turn_id="t1", item_id="c1", **fields), NOW - 10))
    assert row.running_tool == shown


def test_a_response_today_with_no_known_price_has_no_cost():
    row = row_of((started(), NOW - 30), (usage("no-such-model", NOW - 20, 300), NOW - 20))
    assert (row.tokens_today, row.cost_today_usd) == (320, None)


def test_housekeeping_threads_have_no_row():
    assert rows_of(entries((started(ephemeral=True), NOW - 9))) == []


def fleet():
    found = [(started("a", project="shop", git_branch="fix-login"), NOW - 50), (turn("a"), NOW - 40),
             (started("b", "claude-hooks", project="blog"), NOW - 50),
             (started("c", project="shop"), NOW - 50), (turn("c"), NOW - 30),
             (ev.ItemStarted(thread_id="c", turn_id="t1", item_id="x", item_type="mcpToolCall", tool="Grep"), NOW - 2)]
    return rows_of(entries(*found))


FILTER_CASES = {
    "state": ({"state": "working"}, ["a", "c"]),
    "agent": ({"agent": "claude"}, ["b"]),
    "project": ({"project": "shop"}, ["a", "c"]),
    "text in the branch, any case": ({"text": "LOGIN"}, ["a"]),
    "text in the running tool": ({"text": "grep"}, ["c"]),
    "together": ({"state": "working", "project": "blog"}, []),
    "none": ({}, ["a", "c", "b"]),
}


@pytest.mark.parametrize("case", FILTER_CASES)
def test_filters(case):
    criteria, expected = FILTER_CASES[case]
    assert [r.thread_id for r in filter_rows(fleet(), **criteria)] == expected


SORT_CASES = {
    "attention": ["a", "c", "b"],
    "name": ["b", "c", "a"],  # blog, shop, shop (fix-login)
    "last_event": ["c", "a", "b"],
    "context": ["a", "c", "b"],  # no figure: the fleet's order
}


@pytest.mark.parametrize("key", SORT_CASES)
def test_sorting(key):
    assert [r.thread_id for r in sort_rows(fleet(), key)] == SORT_CASES[key]
