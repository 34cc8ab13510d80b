"""Claude Code's stream-json stdout and its hook payloads, as the real CLI 2.1.332 wrote
them (``fixtures/sessions/claude-live``): told apart from transcripts, and read to the
same turns as the CLI's own ``result`` lines."""

import json

import pytest

from tests.monitor.support import parse
from tests.monitor.test_claude_live_transcripts import LIVE, SCENARIOS, stdout_counts
from tillerman.ledger.events import (
    SESSION_ENDED,
    ApprovalRequested,
    ApprovalResolved,
    ItemCompleted,
    QueueEntryRemoved,
    StatusChanged,
    TurnCompleted,
    TurnStarted,
    UserMessage,
)
from tillerman.monitor.counts import count
from tillerman.monitor.formats import detect_format


def read(scenario: str, name: str, fmt: str):
    path = LIVE / scenario / name
    parsed, parser = parse(fmt, path.read_bytes(), source=str(path))
    assert not parser.unknown_types
    return [p.event for p in parsed]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_recording_is_detected_as_what_it_is(scenario: str) -> None:
    for name, fmt in (("stdout.jsonl", "claude-stream-json"), ("transcript.jsonl", "claude-transcript"),
                      ("hooks.jsonl", "claude-hooks")):
        path = LIVE / scenario / name
        if path.exists():
            assert detect_format(path.read_bytes()[:4096], str(path)) == fmt, name


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_stream_json_turns_are_the_result_lines(scenario: str) -> None:
    c = count(read(scenario, "stdout.jsonl", "claude-stream-json"))
    assert c.quarantined == 0
    assert (c.turns, c.interrupted_turns, c.unclosed_turns) == stdout_counts(scenario)


def test_stream_json_turn_ids_are_the_sent_uuids_as_in_the_transcript() -> None:
    stream = [e.turn_id for e in read("interrupt-tool", "stdout.jsonl", "claude-stream-json")
              if isinstance(e, TurnStarted)]
    transcript = [e.turn_id for e in read("interrupt-tool", "transcript.jsonl", "claude-transcript")
                  if isinstance(e, TurnStarted)]
    assert stream == transcript and len(stream) == 2


def test_stream_json_outcomes_of_tools_turns_and_prompts() -> None:
    events = read("hooks", "stdout.jsonl", "claude-stream-json")
    assert [e.status for e in events if isinstance(e, TurnCompleted)] == [
        "completed", "completed", "completed", "interrupted", "failed"]
    assert [e.status for e in events if isinstance(e, ItemCompleted)] == [
        "completed", "completed", "declined", "interrupted"]
    asked = [e.item_id for e in events if isinstance(e, ApprovalRequested)]
    decided = [(e.item_id, e.decision) for e in events if isinstance(e, ApprovalResolved) and e.item_id in asked]
    assert [d for _, d in decided] == ["accept:user_temporary", "reject:user_reject"]
    assert [i for i, _ in decided] == asked


def test_stream_json_queue_lifecycle_keeps_folded_and_withdrawn_apart() -> None:
    folded = [e for e in read("inject", "stdout.jsonl", "claude-stream-json") if isinstance(e, QueueEntryRemoved)]
    assert [e.outcome for e in folded] == ["delivered", "delivered"]
    assert folded[1].turn_id == folded[0].client_id  # the steer went into the first message's turn
    withdrawn = [e for e in read("withdrawn", "stdout.jsonl", "claude-stream-json")
                 if isinstance(e, QueueEntryRemoved)]
    assert [e.outcome for e in withdrawn] == ["delivered", "withdrawn"]


def test_hook_payloads_give_the_same_turns_as_stdout() -> None:
    events = read("hooks", "hooks.jsonl", "claude-hooks")
    c = count(events)
    assert (c.turns, c.interrupted_turns, c.unclosed_turns) == stdout_counts("hooks") == (5, 1, 0)
    assert [e.status for e in events if isinstance(e, TurnCompleted)] == [
        "completed", "completed", "completed", "interrupted", "failed"]
    # The steer folded into the first turn is a user message of that turn, not a turn.
    first = next(e.turn_id for e in events if isinstance(e, TurnStarted))
    assert sum(1 for e in events if isinstance(e, UserMessage) and e.turn_id == first) == 2
    # Approval waits: the allowed call is resolved by its PostToolUse; the denied call
    # fired none, and its PermissionRequest hook ran after the turn's Stop, so no wait is left.
    [asked] = [e.item_id for e in events if isinstance(e, ApprovalRequested)]
    assert ApprovalResolved(item_id=asked, decision="accept", thread_id=events[0].thread_id,
                            turn_id=next(e.turn_id for e in events if isinstance(e, ApprovalRequested))) in events
    assert [e.status for e in events if isinstance(e, ItemCompleted)] == [
        "completed", "completed", "declined", "interrupted"]


def test_a_hook_payload_of_another_shape_is_quarantined_not_raised() -> None:
    lines = [json.dumps({"session_id": "s", "hook_event_name": "PreToolUse", "tool_input": "rm -rf /"}),
             json.dumps({"session_id": "s", "hook_event_name": "Elicitation"})]
    parsed, parser = parse("claude-hooks", ("\n".join(lines) + "\n").encode())
    assert [p.event.reason for p in parsed if p.event.__struct_config__.tag == "quarantined"] == ["wrong_type"]
    assert parser.unknown_types == {"Elicitation": 1}


@pytest.mark.parametrize(("lines", "statuses"), [
    # At stdin EOF the CLI fires SessionEnd: a turn still open was cut short, and the session ended.
    ([{"hook_event_name": "UserPromptSubmit", "prompt_id": "p1", "prompt": "go"},
      {"hook_event_name": "SessionEnd", "reason": "other"}], ["interrupted", "ended"]),
    ([{"hook_event_name": "SessionStart"}, {"hook_event_name": "SessionEnd", "reason": "other"}], ["ended"]),
])
def test_session_end_ends_the_session(lines, statuses) -> None:
    data = "".join(json.dumps({"session_id": "s", **line}) + "\n" for line in lines).encode()
    events = [p.event for p in parse("claude-hooks", data)[0]]
    assert [e.status for e in events if isinstance(e, TurnCompleted | StatusChanged)] == statuses
    assert events[-1] == StatusChanged(thread_id="s", status=SESSION_ENDED)
