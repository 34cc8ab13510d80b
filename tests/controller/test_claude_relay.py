"""The relay state of ``tillerman claude``, on stdout the real Claude Code CLI 2.1.332
wrote (fixtures/sessions/claude-live): what goes on to the harness, the CLI's evidence
that a message of ours reached the model, and the lines tillerman writes."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tillerman.controller.claude.relay import REQUEST_PREFIX, CliFramer, FromCli, Ours, Relay, message_uuid
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
    _, seen = relay_through("inject", Ours(INJECTED, "tillerman-in-1", "in-1", (INJECT_TURN,)))
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
        ready.append((kind(raw), relay.steer_ready((INJECT_TURN,))))
    assert ready[2] == ("system", False)  # the turn runs, no tool yet
    assert ready[4] == ("assistant", True)  # the tool_use: the CLI folds a message in at its result
    assert ("user", False) in ready[7:9]  # the tool result: too late for this round
    assert ready[-1][1] is False and not relay.steer_ready(("another-turn",))


def test_a_queued_message_is_acknowledged_by_the_turn_it_opens():
    _, seen = relay_through("later", Ours(LATER, "tillerman-in-2", "in-2", ()))
    echoes = [echo for _, out in seen for echo in out.echoes]
    assert [(e.turn_id, e.via) for e in echoes] == [(LATER, "system_init")]  # one echo, though result names it too
    assert not [ours for _, out in seen for ours in out.withdraw]


def test_a_steer_still_queued_when_its_turn_ends_is_withdrawn_not_run_as_the_next_turn():
    _, seen = relay_through("later", Ours(LATER, "tillerman-in-3", "in-3", (LATER_TURN,)))
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
    ours, line = relay.message("tillerman-in-4", "in-4", "LATER: after this", expected_turns=(), priority="later")
    assert ours.uuid == message_uuid("tillerman-in-4") == message_uuid("tillerman-in-4")
    sent = json.loads(line)
    assert (sent["uuid"], sent["priority"], sent["message"]["content"]) == (ours.uuid, "later", "LATER: after this")
    _, steer = relay.message("tillerman-in-5", "in-5", "STEER: x", expected_turns=("t",), priority=None)
    assert "priority" not in json.loads(steer)  # folded in at the next tool round


# -- whatever the CLI prints: any JSON value in every field the relay reads -------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)


def cli_lines(value: st.SearchStrategy) -> st.SearchStrategy[dict]:
    """A line of each kind the relay reads, with ``value`` in the field it reads."""
    return st.one_of(
        st.builds(lambda v, s: {"type": "command_lifecycle", "command_uuid": v, "state": s}, value, value),
        st.builds(lambda v, r: {"type": "control_response", "response": {"request_id": v, "response": r}},
                  value, value),
        st.builds(lambda v, r: {"type": "control_response", "response": r | {"request_id": v}}, value,
                  st.dictionaries(st.text(max_size=4), value, max_size=2)),
        st.builds(lambda v, flag: {"type": "user", "isReplay": flag, "uuid": v, "message": {"content": "x"}},
                  value, value),
        st.builds(lambda v: {"type": "result", "user_message_uuids": v}, value),
        st.builds(lambda v: {"type": "result", "user_message_uuids": [v, LATER]}, value),
        st.builds(lambda v: {"type": "system", "subtype": "init", "user_message_uuids": [v]}, value),
        st.builds(lambda v: {"type": "control_request", "request_id": v}, value),
        st.builds(lambda v: {"type": v, "response": v, "command_uuid": v}, value),
    )


def held_back(record: dict, request_id: str | None) -> bool:
    """Whether a line answers tillerman's own messages: only when the id it holds is
    exactly one of ours (``request_id``: our request still unanswered, if any)."""
    response = record.get("response")
    if record["type"] == "control_response":
        return request_id is not None and isinstance(response, dict) and response.get("request_id") == request_id
    if record["type"] == "user":
        return bool(record["isReplay"]) and record["uuid"] == LATER
    return record["type"] == "command_lifecycle" and record["command_uuid"] == LATER


@settings(max_examples=300, deadline=None)
@given(st.lists(cli_lines(st.one_of(JSON, st.just(LATER), st.just(f"{REQUEST_PREFIX}1"))), max_size=6))
def test_any_json_value_in_any_field_the_relay_reads_passes_the_line_on_unless_it_is_our_own_id(records):
    """A list, an object or a number where an id belongs (``command_uuid``, a
    ``request_id``, a ``user_message_uuids`` item, a replayed ``uuid``) once raised
    ``TypeError: unhashable`` and cut the relay at its first line."""
    relay, parser = Relay(), ClaudeStreamParser("claude-wrapper:test")
    relay.ours[LATER] = Ours(LATER, "tillerman-in-6", "in-6", ())
    request_id, _ = relay.control("interrupt")
    for record in records:
        raw = json.dumps(record).encode() + b"\n"
        relay.from_harness(raw)
        unanswered = request_id if request_id in relay.requests else None  # a second answer is not ours
        out = relay.from_cli(raw, [p.event for p in parser.feed(raw)])
        assert out.forward is not held_back(record, unanswered)


def test_an_id_that_is_a_list_or_an_object_is_no_id_of_ours_and_the_line_goes_on():
    relay = Relay()
    relay.ours[LATER] = Ours(LATER, "tillerman-in-7", "in-7", ())
    relay.control("interrupt")
    for record in ({"type": "command_lifecycle", "command_uuid": [LATER], "state": "started"},
                   {"type": "control_response", "response": {"request_id": {"id": 1}}},
                   {"type": "result", "user_message_uuids": [[LATER], {"u": LATER}, 7, LATER]},
                   {"type": "user", "isReplay": True, "uuid": [LATER]}):
        assert relay.from_cli(json.dumps(record).encode() + b"\n", []).forward
    assert relay.from_cli(b"[" * 100_000 + b"\n", []).forward  # too deep for json.loads: not ours either


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=12) | st.sampled_from([b"\n", b"a" * 20, b"b" * 9 + b"\n"]), max_size=12))
def test_the_framer_hands_back_every_byte_in_order_and_holds_no_line_longer_than_its_limit(chunks):
    framer, out = CliFramer(max_line=10), bytearray()
    for chunk in chunks:
        for piece in framer.feed(chunk):
            out += piece.data
            if piece.whole:
                assert piece.data.endswith(b"\n") and len(piece.data) <= 11 and piece.data.count(b"\n") == 1
        assert len(framer._held) <= 10
    out += framer.close() or b""
    assert bytes(out) == b"".join(chunks)
