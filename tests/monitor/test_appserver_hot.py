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
from tillerman.monitor.appserver_events import QUIET_METHODS, HotNotification, decode_hot
from tillerman.monitor.appserver_tap import AppServerTap
from tillerman.monitor.jsonrpc import RpcSession

TRACES = sorted((Path(__file__).parents[2] / "fixtures" / "sessions" / "appserver-trace").glob("*.jsonl"))
HOT = ["thread/status/changed", "turn/started", "turn/completed", "item/started", "item/completed"]


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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hot_messages.map(json.dumps) | hot_raw | frames | raw_frames, max_size=12))
def test_any_frame_maps_the_same_either_way(stream):
    plain, typed = _both_ways(stream)
    assert typed == plain
