"""The relay state of ``tillerman claude``, on stdout the real Claude Code CLI 2.1.332
wrote (fixtures/sessions/claude-live): what goes on to the harness, the CLI's evidence
that a message of ours reached the model, and the lines tillerman writes."""

from __future__ import annotations

import json
from pathlib import Path

from tillerman.controller.claude_relay import REQUEST_PREFIX, FromCli, Ours, Relay, message_uuid
from tillerman.monitor.claude_stream import ClaudeStreamParser

RECORDED = Path(__file__).parents[2] / "fixtures" / "sessions" / "claude-live"
# inject: a message without priority sent while `sleep` ran, folded in at its tool round
INJECT_TURN, INJECTED = "9d24e71c-f6bc-4634-a43a-cec63b185a7d", "3c75b64c-472e-4b00-b067-89309af15f5d"
# later: a message with priority "later", run as its own turn after the first
LATER_TURN, LATER = "a42ec044-42b1-43ce-85d3-924608ed714d", "acfb9851-af0f-485a-bdde-6447ecd97e97"


def relay_through(scenario: str, ours: Ours) -> tuple[Relay, list[tuple[bytes, FromCli]]]:
    """Every line of the recording through a relay that knows ``ours`` as tillerman's message."""
    relay, parser = Relay(), ClaudeStreamParser("claude-wrapper:test")
    relay.ours[ours.uuid] = ours
    seen = []
    for raw in (RECORDED / scenario / "stdout.jsonl").read_bytes().splitlines(keepends=True):
        seen.append((raw, relay.from_cli(raw, [p.event for p in parser.feed(raw)])))
    return relay, seen


def kind(raw: bytes) -> str:
    return json.loads(raw).get("type", "")


def test_a_folded_steer_is_acknowledged_by_the_lifecycle_inside_its_turn_and_its_lifecycle_stays_ours():
    _, seen = relay_through("inject", Ours(INJECTED, "tillerman-in-1", "in-1", INJECT_TURN))
    echoes = [echo for _, out in seen for echo in out.echoes]
    assert [(e.uuid, e.turn_id, e.via) for e in echoes] == [(INJECTED, INJECT_TURN, "command_lifecycle")]
    held = [raw for raw, out in seen if not out.forward]
    assert [json.loads(raw)["state"] for raw in held] == ["queued", "started", "completed"]
    assert all(json.loads(raw)["command_uuid"] == INJECTED for raw in held)
    assert sum(1 for _, out in seen if out.accepted == (INJECTED,)) == 1  # at "queued": accepted, not delivered
    # Every other line goes on, the harness's own message's lifecycle included.
    assert sum(1 for raw, out in seen if out.forward and kind(raw) == "command_lifecycle") == 3


def test_a_steer_goes_out_only_while_a_tool_call_of_its_turn_runs():
    relay, parser = Relay(), ClaudeStreamParser("claude-wrapper:test")
    ready = []
    for raw in (RECORDED / "inject" / "stdout.jsonl").read_bytes().splitlines(keepends=True):
        relay.from_cli(raw, [p.event for p in parser.feed(raw)])
        ready.append((kind(raw), relay.steer_ready(INJECT_TURN)))
    assert ready[2] == ("system", False)  # the turn runs, no tool yet
    assert ready[4] == ("assistant", True)  # the tool_use: the CLI folds a message in at its result
    assert ("user", False) in ready[7:9]  # the tool result: too late for this round
    assert ready[-1][1] is False and not relay.steer_ready("another-turn")


def test_a_queued_message_is_acknowledged_by_the_turn_it_opens():
    _, seen = relay_through("later", Ours(LATER, "tillerman-in-2", "in-2", None))
    echoes = [echo for _, out in seen for echo in out.echoes]
    assert [(e.turn_id, e.via) for e in echoes] == [(LATER, "system_init")]  # one echo, though result names it too
    assert not [ours for _, out in seen for ours in out.withdraw]


def test_a_steer_still_queued_when_its_turn_ends_is_withdrawn_not_run_as_the_next_turn():
    _, seen = relay_through("later", Ours(LATER, "tillerman-in-3", "in-3", LATER_TURN))
    withdraw = [(kind(raw), ours.uuid) for raw, out in seen for ours in out.withdraw]
    assert withdraw == [("result", LATER)]


def test_our_request_ids_never_equal_the_harness_s_and_only_our_answers_are_held_back():
    relay = Relay()
    relay.from_harness(json.dumps({"type": "control_request", "request_id": f"{REQUEST_PREFIX}1",
                                   "request": {"subtype": "get_context_usage"}}).encode() + b"\n")
    request_id, line = relay.control("interrupt", cancel_queued=True)
    assert request_id == f"{REQUEST_PREFIX}2"
    assert json.loads(line) == {"type": "control_request", "request_id": request_id,
                                "request": {"subtype": "interrupt", "cancel_queued": True}}

    def answer(to: str) -> bytes:
        return json.dumps({"type": "control_response", "response": {
            "subtype": "success", "request_id": to, "response": {"still_queued": []}}}).encode() + b"\n"

    assert relay.from_cli(answer(f"{REQUEST_PREFIX}1"), []).forward  # the harness's answer
    ours = relay.from_cli(answer(request_id), [])
    assert not ours.forward and ours.answers[0][0] == request_id


def test_a_message_of_ours_carries_a_uuid_of_its_intent_and_its_priority():
    relay = Relay()
    ours, line = relay.message("tillerman-in-4", "in-4", "LATER: after this", expected_turn=None, priority="later")
    assert ours.uuid == message_uuid("tillerman-in-4") == message_uuid("tillerman-in-4")
    sent = json.loads(line)
    assert (sent["uuid"], sent["priority"], sent["message"]["content"]) == (ours.uuid, "later", "LATER: after this")
    _, steer = relay.message("tillerman-in-5", "in-5", "STEER: x", expected_turn="t", priority=None)
    assert "priority" not in json.loads(steer)  # folded in at the next tool round
