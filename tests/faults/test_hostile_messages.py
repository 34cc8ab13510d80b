"""Hostile input on the app-server connection: whatever the server (or something
pretending to be it) sends, the JSON-RPC layer and the tap never raise; every bad
message becomes a quarantine record with evidence, and good ones still count."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tillerman.ledger.events import Quarantined
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.appserver_tap import AppServerTap
from tillerman.monitor.jsonrpc import BadMessage, RpcSession
from tillerman.monitor.parser import EARLIEST, LATEST

METHODS = ["turn/started", "turn/completed", "item/started", "item/completed", "thread/status/changed",
           "thread/started", "serverRequest/resolved", "thread/queue/changed", "error",
           "item/commandExecution/requestApproval", "no/such/method", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
# messages shaped like the protocol, with fields of any type or missing
params = st.fixed_dictionaries({}, optional={
    "threadId": json_values, "turnId": json_values, "turn": json_values, "item": json_values,
    "status": json_values, "requestId": json_values, "error": json_values, "thread": json_values,
    "emittedAtMs": json_values,
})
messages = st.fixed_dictionaries({"method": st.sampled_from(METHODS) | json_values}, optional={
    "params": params | json_values, "id": json_values, "result": json_values, "error": json_values,
    "emittedAtMs": json_values,
})
frames = st.one_of(
    messages.map(json.dumps),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.just('{"method": "turn/started", "params": {"threadId": "t", "turn": {"id": "u"}}'),  # truncated
)


HOLE = "\x01hole\x01"
# Values no JSON encoder writes: nesting past any limit, numbers beyond 64 bits or a
# double, times out of any calendar, NUL bytes, invalid UTF-8.
RAW = st.sampled_from([
    b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 3_000 + b"1" + b"}" * 3_000, b"[" * 129 + b"]" * 129,
    b"123456789012345678901234567890", str(2**64).encode(), b"9" * 400, b"-" + b"9" * 400, b"1e400", b"1e308",
    b"-1e300", b"253402300800001", b'"a\\u0000b"', b'"a\x00b"', b'"\xff\xfe"', b'"\\ud800"',
])
# the same messages, one value (a time, an id, a whole object) replaced by a raw one
raw_frames = st.tuples(
    st.fixed_dictionaries({"method": st.sampled_from(METHODS)}, optional={
        "params": st.fixed_dictionaries({"threadId": st.just("t")}, optional={
            "turn": st.just({"id": HOLE}), "item": st.just({"type": "agentMessage", "id": "i", "text": HOLE}),
            "startedAtMs": st.just(HOLE), "status": st.just(HOLE), "requestId": st.just(HOLE)}),
        "emittedAtMs": st.just(HOLE), "id": st.just(HOLE)}),
    RAW,
).map(lambda pair: json.dumps(pair[0]).encode().replace(json.dumps(HOLE).encode(), pair[1]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames | raw_frames, max_size=20))
def test_nothing_the_server_sends_makes_the_tap_raise(stream):
    session, tap = RpcSession(), AppServerTap("unix:///fuzz")
    session.request("thread/resume", {})  # a pending id a response may name
    with SQLiteRecorder(":memory:") as ledger:
        for position, frame in enumerate(stream):
            message = session.receive(frame)
            if not hasattr(message, "method") and not isinstance(message, BadMessage):
                continue  # a response: the client hands it to its caller, not to the tap
            out = tap.receive(message, now=1000.0)
            for env in out.envelopes:
                assert env.at is None or EARLIEST <= env.at <= LATEST
                if isinstance(env.event, Quarantined):
                    assert env.event.offset == position and env.event.reason
                    assert env.event_id.startswith("q-")
            ledger.append(out.envelopes)  # whatever comes out, a ledger stores and reads back
        assert ledger.verify().ok and len(list(ledger.read())) == ledger.max_seq()


def test_malformed_messages_are_quarantined_with_the_reason():
    session, tap = RpcSession(), AppServerTap("unix:///x")
    cases = {
        "{not json": "bad_message: invalid JSON",
        "[1, 2]": "bad_message: not a JSON object",
        '{"method": "turn/started", "params": 5}': "bad_message: params is not an object",
        '{"method": "item/commandExecution/requestApproval", "id": 1.5, "params": {}}':
            "bad_message: server request id is not an integer",
        '{"method": "turn/completed", "params": {"threadId": "t", "turn": "oops"}}': "wrong_type",
    }
    for frame, reason in cases.items():
        (env,) = tap.receive(session.receive(frame), now=1.0).envelopes
        assert isinstance(env.event, Quarantined) and env.event.reason.startswith(reason), (frame, env.event)


def test_a_huge_message_is_decoded_or_quarantined_not_fatal():
    session, tap = RpcSession(), AppServerTap("unix:///x")
    huge = json.dumps({"method": "item/completed", "params": {
        "threadId": "t", "turnId": "u", "item": {"type": "agentMessage", "id": "m", "text": "x" * 5_000_000}}})
    (env,) = tap.receive(session.receive(huge), now=1.0).envelopes
    assert env.event.size == 5_000_000 and env.event.text is None  # a digest and a size, never the text


def test_unknown_methods_are_ignored_not_quarantined():
    session, tap = RpcSession(), AppServerTap("unix:///x")
    out = tap.receive(session.receive('{"method": "thread/somethingNew", "params": {"threadId": "t"}}'), now=1.0)
    assert out.envelopes == [] and out.resume == []


def test_a_re_sent_approval_request_is_the_same_fact():
    """The server re-sends a pending approval on every resume: same ids, same time."""
    request = ('{"method": "item/commandExecution/requestApproval", "id": %d, "params": {"threadId": "t",'
               ' "turnId": "u", "itemId": "call-1", "startedAtMs": 1795997074672}}')
    first = AppServerTap("unix:///x").receive(RpcSession().receive(request % 0), now=1.0).envelopes
    again = AppServerTap("unix:///x").receive(RpcSession().receive(request % 7), now=99.0).envelopes
    assert first == again and first[0].at == 1795997074.672


DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000


def test_a_frame_nested_too_deep_is_a_bad_message_quarantined_as_too_deep():
    session, tap = RpcSession(), AppServerTap("unix:///x")
    for frame in (DEEP, DEEP.encode(), '{"method": "turn/started", "params": ' + "[" * 200 + "]" * 200 + "}"):
        message = session.receive(frame)
        assert isinstance(message, BadMessage) and message.reason.startswith("too_deep"), message.reason
        (env,) = tap.receive(message, now=1.0).envelopes
        assert env.event.reason.startswith("bad_message: too_deep") and env.event.length == len(frame)


@pytest.mark.anyio
async def test_a_frame_nested_too_deep_does_not_end_the_connection(tmp_path):
    """The reader goes on to the next frame: the deep one reaches the consumer as a
    BadMessage (and the trace as a digest), the next notification after it."""
    from tillerman.monitor.appserver_client import AppServerClient, JsonlTrace
    from tillerman.monitor.redact import redact_message

    class Frames:  # stands in for the WebSocket: its frames, then the end of the connection
        def __aiter__(self):
            return self._frames()

        async def _frames(self):
            yield DEEP
            yield '{"method": "turn/started", "params": {"threadId": "t", "turn": {"id": "u"}}}'

    trace = JsonlTrace(tmp_path / "trace.jsonl", redact=redact_message)
    client = AppServerClient(Frames(), trace)
    await client._read_frames()
    trace.close()
    received = [message async for message in client.incoming]
    assert isinstance(received[0], BadMessage) and received[0].reason.startswith("too_deep")
    assert received[1].method == "turn/started"
    raw = json.loads((tmp_path / "trace.jsonl").read_text().splitlines()[0])["raw"]
    assert raw.startswith("[redacted sha256:") and raw.endswith(f" {len(DEEP)} bytes]")
