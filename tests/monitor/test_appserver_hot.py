"""The typed decoding of the notification flood (``decode_hot``): a frame it takes maps
to exactly the envelopes its dict would (the tap records the same), and it takes the
notifications a busy server sends most, so the daemon reads those without a dict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.test_hostile_messages import RAW, frames, json_values, raw_frames
from tillerman.ledger.events import Quarantined
from tillerman.monitor.appserver_events import QUIET_METHODS, HotNotification, decode_hot
from tillerman.monitor.appserver_tap import AppServerTap
from tillerman.monitor.jsonrpc import RpcSession

TRACES = sorted((Path(__file__).parents[2] / "fixtures" / "sessions" / "appserver-trace").glob("*.jsonl"))
HOT = ["thread/status/changed", "turn/started", "turn/completed", "item/started", "item/completed",
       "thread/tokenUsage/updated"]


def _both_ways(stream: list[str | bytes]) -> tuple[list, list]:
    """Each frame through the dict path alone, and through ``decode_hot`` first (as the
    daemon's client reads), on two taps of their own."""
    plain, typed = AppServerTap("unix:///x"), AppServerTap("unix:///x")
    plain_session, typed_session = RpcSession(), RpcSession()
    got_plain, got_typed = [], []
    for frame in stream:
        got_plain.append(plain.receive(plain_session.receive(frame), now=1000.0))
        hot = decode_hot(frame)
        got_typed.append(typed.receive(hot if hot is not None else typed_session.receive(frame), now=1000.0))
    return got_plain, got_typed


def _server_frames(path: Path) -> list[str]:
    lines = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [json.dumps(line["msg"]) for line in lines if line["dir"] == "in" and "msg" in line]


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_recorded_traces_map_the_same_either_way(trace):
    stream = _server_frames(trace)
    plain, typed = _both_ways(stream)
    assert typed == plain
    assert any(out.envelopes for out in typed)


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_the_flood_of_a_recorded_trace_is_read_typed(trace):
    for frame in _server_frames(trace):
        message = json.loads(frame)
        hot = decode_hot(frame)
        if "id" not in message and message.get("method") in (*HOT, *QUIET_METHODS):
            assert isinstance(hot, HotNotification), frame[:200]
            assert hot.method == message["method"]
        elif "id" in message:
            assert hot is None  # responses and server requests: RpcSession's


# Shapes of the hot notifications, with any field of any type (or raw bytes no encoder
# writes) in the places their handlers read.
item_fields = st.fixed_dictionaries({}, optional={
    key: json_values | st.sampled_from(["userMessage", "agentMessage", "reasoning", "commandExecution"])
    for key in ("type", "id", "clientId", "text", "command", "aggregatedOutput", "status", "exitCode", "content")
})
hot_messages = st.fixed_dictionaries({"method": st.sampled_from([*HOT, *sorted(QUIET_METHODS)])}, optional={
    "params": st.fixed_dictionaries({}, optional={
        "threadId": json_values, "turnId": json_values, "startedAtMs": json_values,
        "item": item_fields | json_values, "turn": json_values,
        "status": st.fixed_dictionaries({}, optional={"type": json_values, "activeFlags": json_values})
        | json_values}) | json_values,
    "emittedAtMs": json_values, "id": json_values,
})
hot_raw = st.tuples(st.fixed_dictionaries({"method": st.sampled_from(HOT), "params": st.fixed_dictionaries(
    {"threadId": st.just("\x01hole\x01")}, optional={"turn": st.just({"id": "u", "durationMs": "\x01hole\x01"})})}),
    RAW).map(lambda pair: json.dumps(pair[0]).encode().replace(b'"\\u0001hole\\u0001"', pair[1]))


def _skipped_what_a_plain_decode_refuses(plain, typed) -> bool:
    """The one way the two paths may differ: the dict path refused the whole frame for
    a number beyond a double or nesting past the limit, which the typed decode skipped
    (it was in a field no handler reads), so it mapped the frame instead."""
    refused = [env.event.reason for env in plain.envelopes if isinstance(env.event, Quarantined)]
    return (len(refused) == 1 and ("too_deep" in refused[0] or "out of range" in refused[0])
            and not any(isinstance(env.event, Quarantined) for env in typed.envelopes))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hot_messages.map(json.dumps) | hot_raw | frames | raw_frames, max_size=12))
def test_any_frame_maps_the_same_either_way(stream):
    plain, typed = _both_ways(stream)
    for plain_out, typed_out in zip(plain, typed, strict=True):
        if typed_out != plain_out:
            assert _skipped_what_a_plain_decode_refuses(plain_out, typed_out), (plain_out, typed_out)
            break  # the taps' states may differ from here on (a thread subscribed on one only)


# -- what is checked where: the fields a handler reads, and the ones it skips ----------

DEEP = "[" * 200 + "]" * 200
TURN = {"threadId": "t", "turnId": "u"}
AGENT = {"type": "agentMessage", "id": "m", "text": "done"}


def _frame(method: str, params: dict, *, raw: dict | None = None, emitted: str = "1764570000000") -> bytes:
    """A notification whose ``raw`` values (JSON text, keyed by a placeholder in
    ``params``) no encoder writes."""
    text = json.dumps({"method": method, "params": params})[:-1] + f', "emittedAtMs": {emitted}}}'
    for hole, value in (raw or {}).items():
        text = text.replace(json.dumps(hole), value)
    return text.encode()


def _recorded(frame: bytes) -> list:
    hot = decode_hot(frame)
    assert isinstance(hot, HotNotification)
    return AppServerTap("unix:///x").receive(hot, now=1000.0).envelopes


def _refused_whole(frame: bytes, reason: str) -> None:
    assert decode_hot(frame) is None
    out = AppServerTap("unix:///x").receive(RpcSession().receive(frame), now=1000.0)
    assert [env.event.reason for env in out.envelopes] == [f"bad_message: {reason}"]


@pytest.mark.parametrize("value", ["1e400", "-1e400", "9" * 400 + "e10", DEEP, '{"a":' * 200 + "1" + "}" * 200])
@pytest.mark.parametrize("method, params", [
    ("item/completed", {"item": {**AGENT, "extra": "HOLE"}, **TURN}),  # a field of the item no handler reads
    ("item/started", {"item": {"type": "commandExecution", "id": "c", "command": "ls"}, "extra": "HOLE", **TURN}),
    ("turn/started", {"threadId": "t", "turn": {"id": "u", "items": "HOLE"}}),
    ("item/agentMessage/delta", {"delta": "HOLE", **TURN}),  # a quiet notification: all of it skipped
])
def test_a_skipped_field_is_checked_for_syntax_only(method, params, value):
    """A number beyond a double, or nesting past the limit, in a field no handler reads
    never becomes a value: the notification is recorded as if the field were not there."""
    without = json.loads(json.dumps(params).replace('"HOLE"', "null"))
    assert _recorded(_frame(method, params, raw={"HOLE": value})) == _recorded(_frame(method, without))


@pytest.mark.parametrize("method, params, raw", [
    ("item/completed", {"item": {**AGENT, "content": "HOLE"}, **TURN}, {"HOLE": DEEP}),
    ("item/completed", {"item": {"type": "userMessage", "id": "um", "content": "HOLE"}, **TURN},
     {"HOLE": f'[{{"type": "text", "text": "hi", "more": {DEEP}}}]'}),
    ("thread/status/changed", {"threadId": "t", "status": {"type": "active", "activeFlags": "HOLE"}}, {"HOLE": DEEP}),
    ("turn/started", {"threadId": "t", "turn": {"id": "u"}, "startedAtMs": "HOLE"}, {"HOLE": DEEP}),
])
def test_a_read_value_nested_too_deep_refuses_the_frame(method, params, raw):
    _refused_whole(_frame(method, params, raw=raw), "too_deep: nested deeper than 128 levels")


def test_a_read_time_nested_too_deep_refuses_the_frame():
    _refused_whole(_frame("turn/started", {"threadId": "t", "turn": {"id": "u"}}, emitted=DEEP),
                   "too_deep: nested deeper than 128 levels")


@pytest.mark.parametrize("method, params, raw", [
    ("turn/started", {"threadId": "t", "turn": {"id": "u"}, "startedAtMs": "HOLE"}, {"HOLE": "1e400"}),
    ("turn/completed", {"threadId": "t", "turn": {"id": "u", "durationMs": "HOLE"}}, {"HOLE": "1e400"}),
    ("thread/status/changed", {"threadId": "t", "status": {"type": "active", "activeFlags": "HOLE"}},
     {"HOLE": "[1e400]"}),
])
def test_a_read_number_beyond_a_double_refuses_the_frame(method, params, raw):
    frame = _frame(method, params, raw=raw)
    assert decode_hot(frame) is None
    out = AppServerTap("unix:///x").receive(RpcSession().receive(frame), now=1000.0)
    assert len(out.envelopes) == 1 and "out of range" in out.envelopes[0].event.reason


@pytest.mark.parametrize("value", [b'"\xff\xfe"', b'"a\x00b"', b"[1,]", b'"\\q"'])
def test_a_skipped_field_must_still_be_json_in_utf8(value):
    """A binary frame (which the WebSocket layer does not check) with invalid UTF-8, a
    raw NUL or broken syntax in a skipped field is refused whole, as before."""
    frame = _frame("item/agentMessage/delta", {"delta": "HOLE", **TURN}).replace(b'"HOLE"', value)
    assert decode_hot(frame) is None
    out = AppServerTap("unix:///x").receive(RpcSession().receive(frame), now=1000.0)
    assert [type(env.event) for env in out.envelopes] == [Quarantined]
