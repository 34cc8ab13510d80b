"""Transcripts the real Claude Code CLI 2.1.332 wrote (``fixtures/sessions/claude-live``,
recorded by ``fixtures/record_claude_sessions.py``), read against the CLI's own stdout
of the same session as ground truth: a turn per ``system/init``, closed by its
``result``; ``terminal_reason`` ``aborted_*`` is an interrupted turn."""

import json
from pathlib import Path

import pytest

from tests.monitor.support import parse
from tillerman.ledger.events import ApprovalResolved, ItemCompleted, QueueEntryRemoved, TurnCompleted
from tillerman.monitor.counts import count

LIVE = Path(__file__).resolve().parents[2] / "fixtures" / "sessions" / "claude-live"
SCENARIOS = sorted(p.name for p in LIVE.iterdir() if (p / "transcript.jsonl").exists())


def stdout_counts(scenario: str) -> tuple[int, int, int]:
    """(turns, interrupted, unclosed) as the recorded scenario's stdout tells them."""
    return counts_from_stdout([json.loads(line) for line in (LIVE / scenario / "stdout.jsonl").read_text().splitlines()])


def counts_from_stdout(lines: list[dict]) -> tuple[int, int, int]:
    """(turns, interrupted, unclosed) as the CLI's stdout tells them."""
    turns = sum(1 for line in lines if line.get("type") == "system" and line.get("subtype") == "init")
    results = [line for line in lines if line.get("type") == "result"]
    interrupted = sum(1 for r in results if str(r.get("terminal_reason")).startswith("aborted"))
    return turns, interrupted, turns - len(results)


def transcript(scenario: str):
    path = LIVE / scenario / "transcript.jsonl"
    parsed, parser = parse("claude-transcript", path.read_bytes(), source=str(path))
    return [p.event for p in parsed], parser


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "sigterm"])
def test_turn_counts_equal_the_clis_own_stdout(scenario: str) -> None:
    events, parser = transcript(scenario)
    c = count(events)
    assert (c.turns, c.interrupted_turns, c.unclosed_turns) == stdout_counts(scenario)
    assert c.quarantined == 0 and not parser.unknown_types


def test_a_sigterm_leaves_no_result_but_cost_state_ends_the_turn_and_its_tool() -> None:
    # stdout has no result line (the CLI exits 143); the transcript's cost-state shows
    # the process ended, so nothing is left running.
    assert stdout_counts("sigterm") == (1, 0, 1)
    events, _ = transcript("sigterm")
    c = count(events)
    assert (c.turns, c.interrupted_turns, c.unclosed_turns) == (1, 1, 0)
    [tool] = [e for e in events if isinstance(e, ItemCompleted)]
    assert tool.status == "interrupted"


def test_an_api_error_ends_the_turn_failed() -> None:
    events, _ = transcript("api-error")
    [end] = [e for e in events if isinstance(e, TurnCompleted)]
    assert end.status == "failed"


def test_a_priority_now_message_ends_the_running_turn_interrupted() -> None:
    events, _ = transcript("priority-now")
    ends = [e.status for e in events if isinstance(e, TurnCompleted)]
    assert ends == ["interrupted", "completed"]


def test_a_bash_call_killed_mid_run_is_interrupted_not_declined() -> None:
    events, _ = transcript("interrupt-tool")
    [killed, _] = [e for e in events if isinstance(e, ItemCompleted)] + [None]
    assert killed.status == "interrupted"


def test_the_permission_decision_on_a_tool_result_is_kept() -> None:
    events, _ = transcript("permission")
    decisions = [e.decision for e in events if isinstance(e, ApprovalResolved)]
    assert decisions == ["accept:user_temporary", "reject:user_reject"]
    statuses = [e.status for e in events if isinstance(e, ItemCompleted)]
    assert statuses == ["completed", "declined"]


@pytest.mark.parametrize(("scenario", "outcomes"), [
    ("inject", ["delivered", "delivered"]),  # the prompt (dequeued, ran), the steer (folded in)
    ("later", ["delivered", "delivered"]),
    ("withdrawn", ["delivered", "withdrawn"]),  # cancel_async_message
    ("interrupt-tool", ["delivered", "cleared", "delivered"]),  # interrupt with cancel_queued
])
def test_the_queue_keeps_delivered_withdrawn_and_cleared_apart(scenario: str, outcomes: list[str]) -> None:
    events, _ = transcript(scenario)
    removed = [e for e in events if isinstance(e, QueueEntryRemoved)]
    assert [e.outcome for e in removed] == outcomes
    stdout = [json.loads(line) for line in (LIVE / scenario / "stdout.jsonl").read_text().splitlines()]
    sent = {line["command_uuid"] for line in stdout if line.get("type") == "command_lifecycle"}
    named = [e.client_id for e in removed if e.client_id is not None]
    assert named and set(named) <= sent  # the ids are the uuids the messages were sent with
