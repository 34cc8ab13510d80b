import json

from ledger.events import ItemCompleted, QueueChanged, ThreadStarted, TurnCompleted, TurnStarted, UserMessage
from monitor.counts import count
from tests.monitor.support import jsonl, kinds, parse, reasons

SID = "7f3c2a10-5b4e-4d21-9c8a-1e2f3a4b5c6d"


def user(uuid: str, content, **extra) -> str:
    return json.dumps({"type": "user", "sessionId": SID, "uuid": uuid, "timestamp": "2026-11-30T00:51:58.080Z",
                       "isSidechain": False, "message": {"role": "user", "content": content}, **extra})


def assistant(uuid: str, content, stop_reason=None, **extra) -> str:
    return json.dumps({"type": "assistant", "sessionId": SID, "uuid": uuid, "isSidechain": False,
                       "message": {"role": "assistant", "content": content, "stop_reason": stop_reason}, **extra})


def system(subtype: str, **extra) -> str:
    return json.dumps({"type": "system", "subtype": subtype, "sessionId": SID, "uuid": "s-" + subtype, **extra})


def queue(operation: str, content: str | None = None, **extra) -> str:
    record = {"type": "queue-operation", "operation": operation, "sessionId": SID, **extra}
    if content is not None:
        record["content"] = content
    return json.dumps(record)


def run(*lines: str, source: str = f"/p/{SID}.jsonl"):
    parsed, parser = parse("claude-transcript", jsonl(*lines), source=source)
    return [p.event for p in parsed], parser


def test_a_turn_opens_at_a_prompt_and_ends_once():
    evs, _ = run(
        user("u1", "hello"),
        assistant("a1", [{"type": "text", "text": "hi"}], stop_reason="end_turn"),
        system("stop_hook_summary"),
        system("turn_duration", durationMs=1200),
        user("u2", [{"type": "text", "text": "again"}]),
        system("turn_duration", durationMs=900),
    )
    assert kinds(evs) == ["thread_started", "turn_started", "user_message", "agent_message", "turn_completed",
                          "turn_started", "user_message", "turn_completed"]
    assert evs[1] == TurnStarted(thread_id=SID, turn_id="u1")
    assert evs[-1] == TurnCompleted(thread_id=SID, turn_id="u2", status="completed", duration_ms=900)


def test_the_interrupt_marker_ends_the_turn_interrupted():
    evs, _ = run(
        user("u1", "RUN: sleep 20"),
        assistant("a1", [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "sleep 20"}}]),
        user("r1", [{"type": "tool_result", "tool_use_id": "t1", "content": "rejected", "is_error": True}],
             toolUseResult="User rejected tool use", toolDenialKind="user-rejected"),
        user("m1", [{"type": "text", "text": "[Request interrupted by user for tool use]"}], rowSource="harness"),
        user("u2", "next"),
    )
    done = next(e for e in evs if isinstance(e, ItemCompleted))
    assert (done.item_id, done.status, done.item_type, done.tool) == ("t1", "declined", "commandExecution", "Bash")
    ends = [e for e in evs if isinstance(e, TurnCompleted)]
    assert ends == [TurnCompleted(thread_id=SID, turn_id="u1", status="interrupted")]
    c = count(evs)
    assert (c.turns, c.interrupted_turns, c.unclosed_turns) == (2, 1, 1)


def test_meta_and_tool_result_lines_open_no_turn():
    evs, _ = run(
        user("u0", "<command-name>/cost</command-name>", isMeta=True),
        user("u1", "summary of earlier", isCompactSummary=True),
        user("r1", [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}]),
    )
    assert kinds(evs) == ["thread_started", "item_completed"]


def test_the_queue_is_kept_with_full_entries():
    evs, _ = run(
        queue("enqueue", "A"), queue("enqueue", "B"), queue("enqueue", "C"),
        queue("remove", "B", reason="absorbed_mid_turn"),
        queue("dequeue"),
        queue("popAll"),
        queue("teleport"),
    )
    changes = [e for e in evs if isinstance(e, QueueChanged)]
    sizes = [len(c.entries) for c in changes]
    assert sizes == [1, 2, 3, 2, 1, 0]
    a, b, c = changes[2].entries
    assert changes[3].entries == (a, c) and changes[4].entries == (c,)
    assert all(change.known and change.thread_id == SID for change in changes)
    assert len({a.id, b.id, c.id}) == 3


def test_a_folded_message_is_a_user_message_of_the_open_turn():
    folded = json.dumps({"type": "attachment", "sessionId": SID, "uuid": "att1", "isSidechain": False,
                         "attachment": {"type": "queued_command", "prompt": "STEER", "source_uuid": "cmd-1"}})
    evs, _ = run(user("u1", "work"), folded)
    steer = evs[-1]
    assert isinstance(steer, UserMessage) and (steer.turn_id, steer.item_id) == ("u1", "cmd-1")
    assert kinds(evs).count("turn_started") == 1


def test_subagent_file_is_its_own_thread_under_the_session():
    evs, _ = run(
        json.dumps({"type": "user", "sessionId": SID, "agentId": "a2898e3", "isSidechain": True, "uuid": "s1",
                    "message": {"role": "user", "content": "explore"}}),
        source=f"/home/u/.claude/projects/-x/{SID}/subagents/agent-a2898e3.jsonl",
    )
    assert evs[0] == ThreadStarted(thread_id=f"{SID}/agent-a2898e3", parent_thread_id=SID,
                                   source_format="claude-transcript")
    assert evs[1].thread_id == f"{SID}/agent-a2898e3"


def test_sidechain_lines_form_a_second_thread():
    evs, _ = run(
        user("u1", "main"),
        json.dumps({"type": "user", "sessionId": SID, "isSidechain": True, "uuid": "s1",
                    "message": {"role": "user", "content": "side"}}),
    )
    assert count(evs).threads == 2
    assert [e.thread_id for e in evs if isinstance(e, TurnStarted)] == [SID, f"{SID}/sidechain"]


def test_wrong_types_and_unknown_lines():
    evs, parser = run(
        json.dumps({"type": "user", "sessionId": SID, "message": {"content": 5}}),
        json.dumps({"type": "assistant", "sessionId": SID, "message": "text"}),
        json.dumps({"type": "user", "sessionId": SID, "isSidechain": "yes", "message": {"content": "x"}}),
        json.dumps({"type": "cost-state", "sessionId": SID}),
        json.dumps({"type": "hologram", "sessionId": SID}),
    )
    assert reasons(evs) == ["wrong_type"] * 3
    assert parser.unknown_types == {"hologram": 1}


def test_a_quarantined_first_line_does_not_swallow_the_thread_opening():
    evs, _ = run(json.dumps({"type": "user", "sessionId": SID, "message": {"content": 5}}), user("u1", "hello"))
    assert kinds(evs) == ["quarantined", "thread_started", "turn_started", "user_message"]
