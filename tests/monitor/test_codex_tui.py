import json

from tests.monitor.support import jsonl, kinds, parse
from tillerman.ledger.events import ApprovalRequested, ApprovalResolved, ItemCompleted, TurnCompleted


def event(msg: dict, sub: str = "1", ts: str = "2025-09-14T08:30:00.000Z") -> str:
    return json.dumps({"ts": ts, "dir": "to_tui", "kind": "codex_event", "payload": {"id": sub, "msg": msg}})


def op(payload: dict) -> str:
    return json.dumps({"ts": "2025-09-14T08:35:00.000Z", "dir": "from_tui", "kind": "op", "payload": payload})


def run(*lines: str):
    parsed, parser = parse("codex-tui", jsonl(*lines))
    return [p.event for p in parsed], parsed, parser


def test_an_approval_wait_and_its_answer_minutes_later():
    evs, parsed, _ = run(
        event({"type": "session_configured", "session_id": "S"}, sub="0"),
        event({"type": "task_started"}),
        event({"type": "exec_approval_request", "call_id": "call_1", "command": ["bash", "-lc", "git push"]},
              ts="2025-09-14T08:30:07.000Z"),
        op({"type": "exec_approval", "id": "call_1", "decision": "approved"}),
        event({"type": "exec_command_begin", "call_id": "call_1", "command": ["bash", "-lc", "git push"]}),
        event({"type": "exec_command_end", "call_id": "call_1", "exit_code": 0, "aggregated_output": "ok"}),
        event({"type": "task_complete"}),
    )
    assert kinds(evs) == ["thread_started", "turn_started", "approval_requested", "approval_resolved",
                          "item_started", "item_completed", "turn_completed"]
    asked, answered = evs[2], evs[3]
    assert asked == ApprovalRequested(thread_id="S", turn_id="1", item_id="call_1", approval_kind="command")
    assert answered == ApprovalResolved(thread_id="S", turn_id="1", item_id="call_1", decision="approved")
    assert parsed[3].at - parsed[2].at == 293.0
    done = evs[5]
    assert isinstance(done, ItemCompleted) and (done.critical, done.external, done.turn_id) == (True, True, "1")


def test_an_old_answer_names_the_event_and_a_structured_decision_its_variant():
    evs, _, _ = run(
        event({"type": "task_started"}, sub="4"),
        event({"type": "apply_patch_approval_request", "call_id": "p1", "changes": {}}, sub="4"),
        op({"type": "patch_approval", "id": "4", "decision": {"approved_execpolicy_amendment": {"x": 1}}}),
        op({"type": "exec_approval", "id": "unknown", "decision": "denied"}),
    )
    assert evs[-1] == ApprovalResolved(turn_id="4", item_id="p1", decision="approved_execpolicy_amendment")
    assert evs[1].approval_kind == "fileChange"


def test_interrupt_and_screen_noise():
    evs, _, parser = run(
        json.dumps({"ts": "2025-09-14T08:30:00.000Z", "dir": "meta", "kind": "session_start", "cwd": "/x"}),
        json.dumps({"ts": "2025-09-14T08:30:00.000Z", "dir": "to_tui", "kind": "app_event", "variant": "Redraw"}),
        event({"type": "task_started"}, sub="2"),
        event({"type": "agent_message_delta", "delta": "he"}, sub="2"),
        event({"type": "brand_new_msg"}, sub="2"),
        json.dumps({"ts": "2025-09-14T08:30:00.000Z", "dir": "to_tui", "kind": "hologram"}),
        event({"type": "turn_aborted", "reason": "interrupted"}, sub="2"),
    )
    assert kinds(evs) == ["turn_started", "turn_completed"]
    assert evs[-1] == TurnCompleted(turn_id="2", status="interrupted")
    assert parser.unknown_types == {"codex_event:brand_new_msg": 1, "hologram": 1}
