import json

import pytest

from tests.monitor.support import jsonl, kinds, parse
from tillerman.ledger.events import (
    AgentMessage,
    ApprovalRequested,
    ApprovalResolved,
    Error,
    GoalCleared,
    GoalUpdated,
    ItemCompleted,
    ItemStarted,
    QueueChanged,
    StatusChanged,
    ThreadNamed,
    ThreadStarted,
    TurnCompleted,
    TurnStarted,
    UserMessage,
)
from tillerman.monitor.appserver_events import AppServerEvents, natural_key
from tillerman.monitor.digest import digest

T, U = "thread-1", "turn-1"


def note(method: str, params: dict) -> dict:
    return {"method": method, "params": params, "emittedAtMs": 1796000000000}


@pytest.mark.parametrize(("msg", "expected"), [
    (note("thread/started", {"thread": {"id": T, "parentThreadId": "p", "status": {"type": "idle"}}}),
     [ThreadStarted(thread_id=T, parent_thread_id="p", source_format="appserver")]),
    (note("thread/status/changed", {"threadId": T, "status": {"type": "active", "activeFlags": ["waitingOnApproval"]}}),
     [StatusChanged(thread_id=T, status="active", flags=("waitingOnApproval",))]),
    (note("thread/status/changed", {"threadId": T, "status": {"type": "idle"}}),
     [StatusChanged(thread_id=T, status="idle")]),
    (note("turn/started", {"threadId": T, "turn": {"id": U, "status": "inProgress"}}),
     [TurnStarted(thread_id=T, turn_id=U)]),
    (note("turn/completed", {"threadId": T, "turn": {"id": U, "status": "interrupted", "durationMs": 231}}),
     [TurnCompleted(thread_id=T, turn_id=U, status="interrupted", duration_ms=231)]),
    (note("turn/completed", {"threadId": T, "turn": {"id": U, "status": "failed", "error": {"message": "x"}}}),
     [TurnCompleted(thread_id=T, turn_id=U, status="failed")]),
    (note("thread/queue/changed", {"threadId": T}), [QueueChanged(thread_id=T, known=False)]),
    (note("item/started", {"threadId": T, "turnId": U, "item": {"type": "userMessage", "id": "m", "clientId": "c"}}), []),
    (note("item/started", {"threadId": T, "turnId": U, "item": {"type": "agentMessage", "id": "a", "text": ""}}), []),
    (note("item/completed", {"threadId": T, "turnId": U, "item": {"type": "reasoning", "id": "r"}}), []),
    ({"id": "tl-1", "result": {"turnId": U}}, []),
    # Names (kept whatever --retain-payloads says, cut to TITLE_LENGTH) and the end of a session.
    (note("thread/name/updated", {"threadId": T, "threadName": "Fix  the\ncheckout"}),
     [ThreadNamed(thread_id=T, name="Fix the checkout")]),
    (note("thread/name/updated", {"threadId": T}), [ThreadNamed(thread_id=T, name=None)]),
    (note("thread/name/updated", {"threadId": T, "threadName": "x" * 300}), [ThreadNamed(thread_id=T, name="x" * 200)]),
    (note("thread/started", {"thread": {"id": T, "name": "Named before", "status": {"type": "idle"}}}),
     [ThreadStarted(thread_id=T, source_format="appserver"), ThreadNamed(thread_id=T, name="Named before")]),
    (note("thread/started", {"thread": {"id": T, "name": None}}), [ThreadStarted(thread_id=T, source_format="appserver")]),
    (note("thread/closed", {"threadId": T}), [StatusChanged(thread_id=T, status="notLoaded")]),
])
def test_notifications(msg, expected):
    assert AppServerEvents().normalize(msg) == expected


def test_a_started_threads_working_directory_is_a_digest_unless_payloads_are_retained():
    started = note("thread/started", {"thread": {"id": T, "cwd": "/home/ann/acme"}})
    [private] = AppServerEvents().normalize(started)
    [retained] = AppServerEvents(retain_payloads=True).normalize(started)
    assert (private.cwd, private.cwd_digest) == (None, digest("/home/ann/acme"))
    assert retained.cwd == "/home/ann/acme"


def test_user_and_agent_messages():
    mapping = AppServerEvents()
    [user] = mapping.normalize(note("item/completed", {"threadId": T, "turnId": U, "item": {
        "type": "userMessage", "id": "um-1", "clientId": "tillerman-in-0123456789abcdef0123",
        "content": [{"type": "text", "text": "STEER", "text_elements": []}]}}))
    assert isinstance(user, UserMessage)
    assert (user.client_id, user.item_id, user.size, user.text) == ("tillerman-in-0123456789abcdef0123", "um-1", 5, None)
    [agent] = mapping.normalize(note("item/completed", {"threadId": T, "turnId": U, "item": {
        "type": "agentMessage", "id": "msg-1", "text": "ok in-0123456789abcdef0123 and in-ffffffffffffffffffff"}}))
    assert isinstance(agent, AgentMessage)
    assert agent.ack_tokens == ("in-0123456789abcdef0123", "in-ffffffffffffffffffff")


def test_command_items_are_classified():
    mapping = AppServerEvents()
    item = {"type": "commandExecution", "id": "call-1", "command": "/bin/bash -lc 'terraform apply'",
            "status": "inProgress"}
    [started] = mapping.normalize(note("item/started", {"threadId": T, "turnId": U, "item": item}))
    assert isinstance(started, ItemStarted) and (started.critical, started.external) == (True, True)
    [done] = mapping.normalize(note("item/completed", {"threadId": T, "turnId": U, "item": {
        **item, "status": "failed", "exitCode": -1, "aggregatedOutput": "killed"}}))
    assert isinstance(done, ItemCompleted)
    assert (done.status, done.exit_code, done.output_size, done.critical) == ("failed", -1, 6, True)


def test_approvals_are_keyed_by_item_and_resolved_by_request_id():
    mapping = AppServerEvents()
    request = {"method": "item/commandExecution/requestApproval", "id": 0,
               "params": {"threadId": T, "turnId": U, "itemId": "call-25", "command": "ls"}}
    assert mapping.normalize(request) == [ApprovalRequested(thread_id=T, turn_id=U, item_id="call-25")]
    # "0" is not 0: JSON-RPC ids keep their type.
    assert mapping.normalize(note("serverRequest/resolved", {"threadId": T, "requestId": "0"})) == []
    assert mapping.normalize(note("serverRequest/resolved", {"threadId": T, "requestId": 0})) == [
        ApprovalResolved(thread_id=T, turn_id=U, item_id="call-25")]
    assert mapping.normalize(note("serverRequest/resolved", {"threadId": T, "requestId": 0})) == []
    [asked] = mapping.normalize({"method": "item/fileChange/requestApproval", "id": 7,
                                 "params": {"threadId": T, "turnId": U, "itemId": "patch-1"}})
    assert asked.approval_kind == "fileChange"


def test_error():
    [error] = AppServerEvents().normalize(note("error", {"threadId": T, "turnId": U, "willRetry": True, "error": {
        "message": "stream disconnected", "codexErrorInfo": "other"}}))
    assert isinstance(error, Error) and (error.will_retry, error.code) == (True, "other")
    assert error.message_digest.startswith("sha256:")


def test_thread_resume_reply_reveals_the_running_turn():
    assert AppServerEvents().response("thread/resume", {
        "thread": {"id": T}, "initialTurnsPage": {"data": [{"id": U, "status": "inProgress"}]}}) == [
        TurnStarted(thread_id=T, turn_id=U)]
    assert AppServerEvents().response("thread/resume", {
        "thread": {"id": T}, "initialTurnsPage": {"data": [{"id": U, "status": "completed"}]}}) == []


@pytest.mark.parametrize("turn", [{"status": "inProgress"}, {"id": 7, "status": "inProgress"}])
def test_a_running_turn_without_a_usable_id_reveals_nothing(turn):
    """The page is read by the wire module (``codex_wire.parse_turn_page``), one turn at a
    time: a turn with no id names nothing to follow, and spoils none of the others."""
    page = {"data": [turn, {"id": U, "status": "inProgress"}]}
    assert AppServerEvents().response("thread/resume", {"thread": {"id": T}, "initialTurnsPage": page}) == [
        TurnStarted(thread_id=T, turn_id=U)]


def test_natural_keys_are_stable_and_ignore_request_ids():
    first, second = AppServerEvents(), AppServerEvents()
    params = {"threadId": T, "turnId": U, "itemId": "call-25"}
    [a] = first.normalize({"method": "item/commandExecution/requestApproval", "id": 0, "params": params})
    [b] = second.normalize({"method": "item/commandExecution/requestApproval", "id": 41, "params": params})
    assert natural_key(a) == natural_key(b) == json.dumps(
        ["approval_requested", T, U, "call-25", None], separators=(",", ":"))
    started = TurnCompleted(thread_id=T, turn_id=U, status="completed")
    assert natural_key(started) != natural_key(TurnCompleted(thread_id=T, turn_id=U, status="interrupted"))
    assert natural_key(ItemStarted(thread_id=T, turn_id=U, item_id="x", item_type="t")) != natural_key(
        ItemCompleted(thread_id=T, turn_id=U, item_id="x", item_type="t"))


def test_facts_without_identity_need_a_discriminator():
    active = StatusChanged(thread_id=T, status="active")
    assert natural_key(active, 1) != natural_key(active, 2)
    assert natural_key(active, 1) == natural_key(StatusChanged(thread_id=T, status="active"), 1)
    assert natural_key(active, 1) != natural_key(StatusChanged(thread_id=T, status="active",
                                                               flags=("waitingOnApproval",)), 1)
    echo = UserMessage(thread_id=T, turn_id=U, item_id="um-1", digest="sha256:x", size=1)
    assert natural_key(echo, 1) == natural_key(echo, 2)  # an item id is identity enough


def test_trace_reads_only_what_the_server_said():
    trace = jsonl(
        json.dumps({"ts": 1.5, "dir": "out", "msg": {"id": "tl-2", "method": "thread/resume", "params": {"threadId": T}}}),
        json.dumps({"ts": 1.6, "dir": "in", "msg": {"id": "tl-2", "result": {
            "thread": {"id": T}, "initialTurnsPage": {"data": [{"id": U, "status": "inProgress"}]}}}}),
        json.dumps({"ts": 1.7, "dir": "out", "msg": {"id": 5, "method": "turn/steer", "params": {"threadId": T}}}),
        json.dumps({"ts": 1.8, "dir": "in", "msg": {"id": 5, "result": {"turnId": U}}}),
        json.dumps({"ts": 1.9, "dir": "in", "msg": note("remoteControl/status/changed", {})}),
        json.dumps({"ts": 2.0, "dir": "in", "msg": note("turn/completed", {"threadId": T, "turn": {"id": U, "status": "completed"}})}),
        json.dumps({"ts": "late", "dir": "in", "msg": note("turn/started", {"threadId": T, "turn": {"id": U}})}),
        json.dumps({"ts": 2.1, "dir": "in", "msg": 5}),
    )
    parsed, parser = parse("appserver-trace", trace)
    assert kinds([p.event for p in parsed]) == ["turn_started", "turn_completed", "quarantined", "quarantined"]
    assert [p.at for p in parsed[:2]] == [1.6, 2.0]
    assert parser.unknown_types == {"remoteControl/status/changed": 1}


# The shapes Codex 0.171.0 sent (fixtures/sessions/appserver-trace/live-goal.jsonl).
GOAL = {"threadId": T, "objective": "keep going", "status": "budgetLimited", "tokenBudget": 200,
        "tokensUsed": 13354, "timeUsedSeconds": 0, "createdAt": 1796562309, "updatedAt": 1796562309}


def test_goal_updates_and_clears_are_recorded_with_the_objective_as_a_digest():
    events = AppServerEvents().normalize(note("thread/goal/updated", {"threadId": T, "turnId": U, "goal": GOAL}))
    assert events == [GoalUpdated(thread_id=T, turn_id=U, status="budgetLimited", objective_digest=digest("keep going"),
                                  token_budget=200, tokens_used=13354, time_used_seconds=0.0)]
    retained = AppServerEvents(retain_payloads=True).normalize(
        note("thread/goal/updated", {"threadId": T, "turnId": None, "goal": GOAL}))
    assert retained[0].objective == "keep going" and retained[0].turn_id is None
    assert AppServerEvents().normalize(note("thread/goal/cleared", {"threadId": T})) == [GoalCleared(thread_id=T)]


def test_a_goal_in_a_reply_is_recorded_and_our_own_set_says_so():
    mapping = AppServerEvents()
    got, = mapping.response("thread/goal/get", {"goal": GOAL})
    assert (got.thread_id, got.status, got.by) == (T, "budgetLimited", None)
    set_, = mapping.response("thread/goal/set", {"goal": {**GOAL, "status": "paused"}})
    assert (set_.status, set_.by) == ("paused", "tillerman")
    assert mapping.response("thread/goal/get", {"goal": None}) == []  # no goal: nothing to record


def test_a_garbled_goal_field_reads_as_absent():
    event, = AppServerEvents().normalize(note("thread/goal/updated", {"threadId": T, "goal": {
        "status": "active", "tokenBudget": "lots", "tokensUsed": True, "objective": 7}}))
    assert (event.token_budget, event.tokens_used, event.objective_digest) == (None, None, None)
