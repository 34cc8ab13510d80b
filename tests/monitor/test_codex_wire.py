"""The Codex wire format of delivery: requests as the real server took them, replies read
into typed values, and malformed replies read as absent fields, never an exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tillerman.monitor import codex_wire as wire
from tillerman.monitor.codex_wire import (
    InterruptAccepted,
    QueuedSubmission,
    QueueEntry,
    QueuePage,
    QueueStarted,
    SteerAccepted,
    Terminal,
    TerminalList,
    Terminated,
    Turn,
    TurnItem,
    TurnPage,
)

TRACE = "sessions/appserver-trace/live-supervised.jsonl"  # recorded from the real app-server 0.163.0


def _exchanges(fixtures_dir) -> dict[str, list[tuple[dict, object]]]:
    """Each request tillerman sent in the trace, with the server's reply, by method."""
    messages = [json.loads(line)["msg"] for line in (fixtures_dir / TRACE).read_text().splitlines()]
    sent = {m["id"]: m for m in messages if "method" in m and isinstance(m.get("id"), str)}
    exchanges: dict[str, list[tuple[dict, object]]] = {}
    for message in messages:
        request = sent.get(message.get("id")) if "result" in message else None
        if request is not None:
            exchanges.setdefault(request["method"], []).append((request["params"], message["result"]))
    return exchanges


def test_requests_and_replies_as_the_real_server_exchanged_them(fixtures_dir):
    exchanges = _exchanges(fixtures_dir)
    [(params, reply)] = exchanges["turn/steer"]
    assert wire.steer(params["threadId"], params["expectedTurnId"], params["clientUserMessageId"],
                      params["input"][0]["text"]) == ("turn/steer", params)
    assert wire.parse_steer_accepted(reply) == SteerAccepted(params["expectedTurnId"])

    [(params, reply)] = exchanges["thread/queue/add"]
    assert wire.queue_add(params["threadId"], params["clientUserMessageId"],
                          params["input"][0]["text"]) == ("thread/queue/add", params)
    assert wire.parse_queued_submission(reply) == QueuedSubmission("01a22a02-a59a-75a0-a894-deb3e4ddc9d4")

    [(params, reply)] = exchanges["turn/interrupt"]
    assert wire.interrupt(params["threadId"], params["turnId"]) == ("turn/interrupt", params)
    assert reply == {} and wire.parse_interrupt_accepted(reply) == InterruptAccepted()

    *idle, (params, reply) = exchanges["thread/backgroundTerminals/list"]
    assert wire.terminals_list(params["threadId"]) == ("thread/backgroundTerminals/list", params)
    assert all(wire.parse_terminal_list(r) == TerminalList() for _, r in idle)
    assert wire.parse_terminal_list(reply) == TerminalList((Terminal("call-resp-3", "39466"),))

    [(params, reply)] = exchanges["thread/backgroundTerminals/terminate"]
    assert wire.terminate(params["threadId"], params["processId"]) == ("thread/backgroundTerminals/terminate", params)
    assert wire.parse_terminated(reply) == Terminated(True)

    [(params, reply)] = exchanges["thread/queue/start"]
    assert wire.queue_start(params["threadId"]) == ("thread/queue/start", params)
    assert wire.parse_queue_started(reply) == QueueStarted("01a22a02-a5a9-70c2-9a8b-6d98104243b0")


def test_a_turn_page_as_thread_turns_list_returns_it():
    """reference/codex-app-server.md §1.2 and §2: full items, newest turn first."""
    reply = {"data": [
        {"id": "T2", "rootTurnId": "T2", "itemsView": "full", "status": "inProgress", "error": None, "items": [
            {"type": "userMessage", "id": "u1", "clientId": None, "content": [{"type": "text", "text": "RUN"}]},
            {"type": "commandExecution", "id": "call-1", "command": "sleep 5", "processId": "83770"},
            {"type": "userMessage", "id": "u2", "clientId": "steer-1", "content": []},
            {"type": "agentMessage", "id": "msg-1", "text": "ack in-0123", "phase": None}]},
        {"id": "T1", "status": "interrupted", "items": []}],
        "nextCursor": "{\"turn\":\"T1\"}", "backwardsCursor": "{}"}
    assert wire.parse_turn_page(reply) == TurnPage((
        Turn("T2", "inProgress", (TurnItem("userMessage", "u1"), TurnItem("commandExecution", "call-1"),
                                  TurnItem("userMessage", "u2", "steer-1"),
                                  TurnItem("agentMessage", "msg-1", text="ack in-0123"))),
        Turn("T1", "interrupted")), next_cursor="{\"turn\":\"T1\"}")
    assert wire.parse_turn_page(reply).turns[0].running and not wire.parse_turn_page(reply).turns[1].running


def test_a_queue_page_as_thread_queue_list_returns_it():
    """reference/codex-app-server.md §4."""
    reply = {"data": [{"id": "q1", "input": [{"type": "text", "text": "queued A"}], "clientUserMessageId": "dup"},
                      {"id": "q2", "input": [], "clientUserMessageId": None}], "nextCursor": None}
    assert wire.parse_queue_page(reply) == QueuePage((QueueEntry("q1", "dup"), QueueEntry("q2")))


@pytest.mark.parametrize(("cursor", "full", "params"), [
    (None, False, {"threadId": "t", "limit": 20}),
    (None, True, {"threadId": "t", "limit": 20, "itemsView": "full"}),
    ("c2", True, {"threadId": "t", "limit": 20, "itemsView": "full", "cursor": "c2"}),
    ("", True, {"threadId": "t", "limit": 20, "itemsView": "full"}),  # no cursor: the newest page
])
def test_turns_list_request(cursor, full, params):
    assert wire.turns_list("t", 20, cursor=cursor, full_items=full) == ("thread/turns/list", params)


def test_thread_read_request_and_its_working_directory():
    assert wire.thread_read("t") == ("thread/read", {"threadId": "t"})
    assert wire.parse_thread_cwd({"thread": {"id": "t", "cwd": "/work/ws", "turns": []}}) == "/work/ws"


# -- malformed replies -----------------------------------------------------------------------


@pytest.mark.parametrize(("parse", "reply", "expected"), [
    (wire.parse_steer_accepted, None, SteerAccepted()),
    (wire.parse_steer_accepted, {"turnId": 7}, SteerAccepted()),
    (wire.parse_queued_submission, {"queuedSubmission": "q1"}, QueuedSubmission()),
    (wire.parse_queued_submission, [], QueuedSubmission()),
    (wire.parse_queue_page, {"data": {"id": "q1"}}, QueuePage(readable=False)),
    (wire.parse_queue_page, {"data": ["q1", None, {"id": 1, "clientUserMessageId": "c"}]},
     QueuePage((QueueEntry(None, "c"),))),  # only objects are entries; a numeric id reads as absent
    (wire.parse_turn_page, {"data": 5, "nextCursor": ""}, TurnPage(readable=False)),
    (wire.parse_turn_page, {"data": [{"id": "T", "status": ["x"], "items": "all"}], "nextCursor": 3},
     TurnPage((Turn("T"),))),
    (wire.parse_turn_page, {"data": [{"items": [1, {"type": "userMessage", "clientId": {"c": 1}}]}]},
     TurnPage((Turn(None, None, (TurnItem("userMessage"),)),))),
    (wire.parse_terminal_list, {"data": [{"itemId": "i", "processId": 42}, {"itemId": "j"},
                                         {"itemId": "k", "processId": True}]},
     TerminalList((Terminal("i", "42"), Terminal("j"), Terminal("k")))),
    (wire.parse_terminated, {"terminated": "true"}, Terminated(False)),
    (wire.parse_queue_started, {"turn": None}, QueueStarted()),
])
def test_a_malformed_field_reads_as_absent(parse, reply, expected):
    assert parse(reply) == expected


def test_a_threads_loaded_status_is_its_type():
    assert wire.parse_thread_status({"thread": {"id": "t", "status": {"type": "active", "activeFlags": []}}}) \
        == wire.RUNNING
    assert wire.parse_thread_status({"thread": {"status": {"type": "idle"}}}) == "idle"
    for reply in (None, {"thread": None}, {"thread": {"status": "active"}}, {"thread": {"status": {"type": 1}}}):
        assert wire.parse_thread_status(reply) is None


def test_a_thread_with_no_usable_working_directory_names_none():
    for reply in (None, {"thread": None}, {"thread": {"cwd": ""}}, {"thread": {"cwd": ["/ws"]}}):
        assert wire.parse_thread_cwd(reply) is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["data", "turnId", "id", "status", "items", "type", "clientId", "text", "nextCursor",
                         "queuedSubmission", "clientUserMessageId", "itemId", "processId", "terminated", "turn",
                         "thread", "cwd", "other"]), inner, max_size=6),
    max_leaves=30)
PARSERS = {
    wire.parse_steer_accepted: SteerAccepted, wire.parse_interrupt_accepted: InterruptAccepted,
    wire.parse_queued_submission: QueuedSubmission, wire.parse_queue_page: QueuePage,
    wire.parse_turn_page: TurnPage, wire.parse_terminal_list: TerminalList, wire.parse_terminated: Terminated,
    wire.parse_queue_started: QueueStarted,
}


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_every_parser_reads_any_json_without_raising(reply):
    for parse, kind in PARSERS.items():
        parsed = parse(reply)
        assert isinstance(parsed, kind)
        _assert_typed(parsed)
    assert wire.parse_thread_cwd(reply) is None or isinstance(wire.parse_thread_cwd(reply), str)
    assert wire.parse_thread_status(reply) is None or isinstance(wire.parse_thread_status(reply), str)


def _assert_typed(value) -> None:
    """Every field holds what its annotation says: strings are strings, never a stray dict."""
    for name in value.__struct_fields__:
        field = getattr(value, name)
        if isinstance(field, tuple):
            for element in field:
                _assert_typed(element)
        else:
            assert field is None or isinstance(field, str | bool), (name, field)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=6), st.sampled_from(["inProgress", "completed", "interrupted"]),
                          st.lists(st.tuples(st.sampled_from(["userMessage", "agentMessage", "reasoning"]),
                                             st.text(max_size=6), st.text(max_size=6)), max_size=4)),
                max_size=4), JSON)
def test_one_garbled_turn_costs_only_itself(turns, garbage):
    """A page of well-formed turns reads back exactly, whatever malformed entry joins it."""
    data = [{"id": turn_id, "status": status, "items": [{"type": kind, "id": item_id, "clientId": said,
                                                         "text": said} for kind, item_id, said in items]}
            for turn_id, status, items in turns]
    expected = tuple(Turn(turn_id, status, tuple(TurnItem(kind, item_id, said, said) for kind, item_id, said in items))
                     for turn_id, status, items in turns)
    if not isinstance(garbage, dict):
        assert wire.parse_turn_page({"data": [*data, garbage]}).turns == expected
    assert wire.parse_turn_page({"data": data}).turns == expected
