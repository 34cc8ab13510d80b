"""The guarded adapter at its boundary, joined to the delivery machine through an
in-memory fake app-server (no sockets): what is refused sends nothing."""

from __future__ import annotations

from collections.abc import Callable
import time
from itertools import count
from typing import Any

import anyio
import pytest

from tillerman.controller.core.boundary import (
    CommandMismatch,
    InterruptHazard,
    NoDispatchRecord,
    ReplayedIntent,
    Unauthorized,
)
from tillerman.controller.core.commands import (
    Interrupt,
    QueueList,
    ReadBack,
    ReadTurns,
    ResumeQueue,
    RunVerify,
    Steer,
    Terminate,
)
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Dispatch, NoAnswer, Observed, Refused, Replied, Verified
from tillerman.controller.core.intent_requests import intent_view, proposal_envelopes, transition_envelope
from tillerman.controller.dispatch.adapter import GuardedAdapter, request_for
from tillerman.controller.dispatch.driver import StaleDelivery, carry_out
from tillerman.ledger.events import ApprovalRequested, Envelope, ItemStarted, ThreadStarted, TurnCompleted, TurnStarted
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent, intent_id_from, text_digest
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.appserver_client import AppServerDisconnected
from tillerman.monitor.digest import digest
from tillerman.monitor.jsonrpc import RpcError
from tillerman.rules.ruleset import Grant, build_ruleset

pytestmark = pytest.mark.anyio

THREAD, TURN, NEXT_TURN = "thread-1", "turn-1", "turn-2"
NOW = 1_000.0
ANN = "owner:ann"
_ids = count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeAppServer:
    """Answers each method from a script (a value, an exception, or a function of the
    params) and keeps every request it was sent, in order."""

    def __init__(self, **script: Any):
        self.script = {method.replace("__", "/"): answer for method, answer in script.items()}
        self.sent: list[tuple[str, dict]] = []

    async def request(self, method: str, params: dict | None = None, timeout: float = 10.0) -> Any:
        self.sent.append((method, params or {}))
        answer = self.script[method]
        if isinstance(answer, Callable):
            answer = answer(params)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def methods(self) -> list[str]:
        return [method for method, _ in self.sent]


def make_intent(mode: str = "steer", **fields) -> Intent:
    return Intent(
        id=intent_id_from("adapter", mode, next(_ids)), thread_id=THREAD, mode=mode, text="check the logs",
        text_digest=text_digest("check the logs"), created_at=NOW, ack_deadline=NOW + 120, expires_at=NOW + 1800,
        expected_turn_id=None if mode == "queue" else TURN, producer=ANN, **fields,
    )


def grants(*actions: str, subject: str = ANN):
    return build_ruleset((), (Grant(subject=subject, actions=frozenset(actions)),))


def ledger_with(intent: Intent, *observations) -> SQLiteRecorder:
    recorder = SQLiteRecorder()
    recorder.append([Envelope(event_id="turn", event=TurnStarted(thread_id=THREAD, turn_id=TURN),
                              source="appserver", at=NOW)])
    recorder.append([Envelope(event_id=f"obs-{i}", event=e, source="appserver", at=NOW)
                     for i, e in enumerate(observations)])
    recorder.append(proposal_envelopes(intent, Projection()))
    return recorder


def mark_dispatching(recorder: SQLiteRecorder, intent: Intent, attempt: str = "a1") -> None:
    recorder.append([transition_envelope(intent, State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching",
                                         {"attempt": attempt, "mode": intent.mode}, NOW)], durable=True)


def steer_for(intent: Intent, attempt: str = "a1", turn: str = TURN) -> Steer:
    return Steer(intent_id=intent.id, thread_id=THREAD, expected_turn_id=turn,
                 client_user_message_id=intent.client_user_message_id, text=intent.delivered_text, attempt=attempt)


def interrupt_for(intent: Intent, attempt: str = "a1") -> Interrupt:
    return Interrupt(intent_id=intent.id, thread_id=THREAD, turn_id=TURN, attempt=attempt)


def adapter_for(recorder, server, ruleset) -> GuardedAdapter:
    return GuardedAdapter(server, recorder, ruleset, clock=lambda: NOW + 1)


# -- the boundary ---------------------------------------------------------------------------


async def test_unauthorized_request_is_refused_at_the_boundary_and_nothing_is_sent():
    intent = make_intent()
    recorder = ledger_with(intent)
    mark_dispatching(recorder, intent)
    server = FakeAppServer(turn__steer={"turnId": TURN})
    for ruleset in (grants("queue"), grants("steer", subject="owner:bob"),
                    build_ruleset((), (Grant(subject=ANN, actions=frozenset({"steer"}), threads=("other",)),))):
        with pytest.raises(Unauthorized):
            await adapter_for(recorder, server, ruleset).execute(steer_for(intent))
    assert server.sent == []


async def test_unauthorized_dispatch_through_the_machine_ends_rejected_with_nothing_sent():
    intent = make_intent()
    recorder = ledger_with(intent)
    server = FakeAppServer(turn__steer={"turnId": TURN})
    await carry_out(Delivery(intent), Dispatch(NOW, "a1"), recorder, adapter_for(recorder, server, grants()))
    view = intent_view(recorder, intent.id)
    assert (view.state, view.history[-1].reason, view.history[-1].evidence["boundary"]) == (
        "rejected", "refused", "unauthorized")
    assert server.sent == []


async def test_replayed_intent_is_refused_whatever_its_ledger_state():
    intent = make_intent(replayed=True)
    recorder = ledger_with(intent)
    mark_dispatching(recorder, intent)
    server = FakeAppServer(turn__steer={"turnId": TURN})
    with pytest.raises(ReplayedIntent):
        await adapter_for(recorder, server, grants("steer")).execute(steer_for(intent))
    assert server.sent == []


async def test_no_durable_dispatch_record_means_nothing_is_sent():
    intent = make_intent()
    recorder = ledger_with(intent)
    server = FakeAppServer(turn__steer={"turnId": TURN})
    adapter = adapter_for(recorder, server, grants("steer"))
    with pytest.raises(NoDispatchRecord):  # still proposed: the record was never written
        await adapter.execute(steer_for(intent))
    mark_dispatching(recorder, intent, attempt="a1")
    with pytest.raises(NoDispatchRecord):  # a record, but another attempt's
        await adapter.execute(steer_for(intent, attempt="a2"))
    recorder.append([transition_envelope(intent, State.DISPATCH_UNKNOWN, State.QUEUED, "accepted", {}, NOW)])
    with pytest.raises(NoDispatchRecord):  # already accepted: a second send would be a resend
        await adapter.execute(steer_for(intent))
    assert server.sent == []


async def test_a_command_that_does_not_match_its_intent_is_refused():
    intent = make_intent()
    recorder = ledger_with(intent)
    mark_dispatching(recorder, intent)
    server = FakeAppServer(turn__steer={"turnId": TURN})
    adapter = adapter_for(recorder, server, grants("steer"))
    with pytest.raises(CommandMismatch):
        await adapter.execute(steer_for(intent, turn=NEXT_TURN))  # never the newest turn instead
    with pytest.raises(CommandMismatch):
        await adapter.execute(interrupt_for(intent))
    assert server.sent == []


@pytest.mark.parametrize("hazard", [
    ApprovalRequested(thread_id=THREAD, turn_id=TURN, item_id="call-1"),
    ItemStarted(thread_id=THREAD, turn_id=TURN, item_id="call-2", item_type="commandExecution", critical=True),
    ItemStarted(thread_id=THREAD, turn_id=TURN, item_id="call-3", item_type="commandExecution", external=True),
], ids=["approval_pending", "critical_tool", "external_effect_unknown"])
async def test_interrupt_is_refused_during_an_approval_a_critical_tool_or_an_unknown_effect(hazard):
    intent = make_intent("interrupt")
    recorder = ledger_with(intent, hazard)
    mark_dispatching(recorder, intent)
    server = FakeAppServer(turn__interrupt={})
    with pytest.raises(InterruptHazard):
        await adapter_for(recorder, server, grants("interrupt", "interrupt_critical")).execute(interrupt_for(intent))
    assert server.sent == []


async def test_forced_interrupt_through_a_critical_tool_needs_interrupt_critical_and_is_recorded():
    critical = ItemStarted(thread_id=THREAD, turn_id=TURN, item_id="call-2", item_type="commandExecution",
                           critical=True)
    server = FakeAppServer(turn__interrupt={})
    intent = make_intent("interrupt", force=True)
    recorder = ledger_with(intent, critical)
    mark_dispatching(recorder, intent)
    with pytest.raises(InterruptHazard, match="no interrupt_critical grant"):
        await adapter_for(recorder, server, grants("interrupt")).execute(interrupt_for(intent))
    with pytest.raises(Unauthorized):  # interrupt_critical is checked in addition to interrupt, never instead
        await adapter_for(recorder, server, grants("interrupt_critical")).execute(interrupt_for(intent))
    assert server.sent == []

    fact = await adapter_for(recorder, server, grants("interrupt", "interrupt_critical")).execute(interrupt_for(intent))
    assert isinstance(fact, Replied) and server.methods() == ["turn/interrupt"]
    forced = [h for h in intent_view(recorder, intent.id).history if h.reason == "forced_during_critical_tool"]
    assert [h.evidence["grant"] for h in forced] == ["interrupt_critical"]


async def test_forced_interrupt_is_still_refused_during_an_approval():
    intent = make_intent("interrupt", force=True)
    recorder = ledger_with(intent, ApprovalRequested(thread_id=THREAD, turn_id=TURN, item_id="call-1"))
    mark_dispatching(recorder, intent)
    server = FakeAppServer(turn__interrupt={})
    with pytest.raises(InterruptHazard, match="approval"):
        await adapter_for(recorder, server, grants("interrupt", "interrupt_critical")).execute(interrupt_for(intent))
    assert server.sent == []


async def test_terminate_and_resume_only_after_the_interrupt_and_only_as_asked():
    intent = make_intent("interrupt")
    recorder = ledger_with(intent)
    mark_dispatching(recorder, intent)
    server = FakeAppServer(thread__backgroundTerminals__terminate={"terminated": True}, thread__queue__start={})
    adapter = adapter_for(recorder, server, grants("interrupt"))
    ours = Terminate(intent_id=intent.id, thread_id=THREAD, process_id="22", item_id="call-1", turn_id=TURN)
    with pytest.raises(NoDispatchRecord):  # the interrupt is not acknowledged yet
        await adapter.execute(ours)
    recorder.append([transition_envelope(intent, State.DISPATCH_UNKNOWN, State.ACKNOWLEDGED, "turn_interrupted",
                                         {}, NOW)])
    with pytest.raises(CommandMismatch):
        await adapter.execute(Terminate(intent_id=intent.id, thread_id=THREAD, process_id="11", item_id="call-0",
                                        turn_id="turn-0"))
    with pytest.raises(CommandMismatch):
        await adapter.execute(ResumeQueue(intent_id=intent.id, thread_id=THREAD))
    assert server.sent == []
    assert isinstance(await adapter.execute(ours), Replied)
    assert server.sent == [("thread/backgroundTerminals/terminate", {"threadId": THREAD, "processId": "22"})]


# -- outcomes -------------------------------------------------------------------------------


def test_requests_have_the_real_app_server_shapes():
    intent = make_intent()
    assert request_for(steer_for(intent)) == ("turn/steer", {
        "threadId": THREAD, "expectedTurnId": TURN, "clientUserMessageId": intent.client_user_message_id,
        "input": [{"type": "text", "text": f"check the logs\n\n[tillerman {intent.id}]"}]})
    assert request_for(interrupt_for(intent)) == ("turn/interrupt", {"threadId": THREAD, "turnId": TURN})
    assert request_for(QueueList(intent_id=intent.id, thread_id=THREAD)) == ("thread/queue/list",
                                                                              {"threadId": THREAD})


@pytest.mark.parametrize(("answer", "expected"), [
    (RpcError(-32600, f"expected active turn id `{TURN}` but found `{NEXT_TURN}`"), Refused),
    (RpcError(-32603, "something new went wrong"), NoAnswer),
    (TimeoutError(), NoAnswer),
    (AppServerDisconnected("closed"), NoAnswer),
    ({"turnId": TURN}, Replied),
])
async def test_each_transport_outcome_becomes_a_fact(answer, expected):
    intent = make_intent()
    recorder = ledger_with(intent)
    mark_dispatching(recorder, intent)
    fact = await adapter_for(recorder, FakeAppServer(turn__steer=answer), grants("steer")).execute(steer_for(intent))
    assert type(fact) is expected


@pytest.mark.parametrize("page", [{}, {"data": None, "nextCursor": None}, {"data": {"id": TURN}}, "garbage", None])
async def test_a_readback_without_its_list_settles_nothing(page):
    """A timed-out steer is read back once its turn ended; a reply with no turn list
    proves no absence, so the intent stays of unknown outcome (evidence only) rather
    than expiring as not delivered, and nothing is resent."""
    intent = make_intent()
    recorder = ledger_with(intent)
    server = FakeAppServer(turn__steer=TimeoutError(), thread__turns__list=page)
    adapter = adapter_for(recorder, server, grants("steer"))
    machine = Delivery(intent)
    await carry_out(machine, Dispatch(NOW, "a1"), recorder, adapter)
    await carry_out(machine, Observed(TurnCompleted(thread_id=THREAD, turn_id=TURN), NOW + 2), recorder, adapter)
    view = intent_view(recorder, intent.id)
    assert view.state == "dispatch_unknown"
    assert view.history[-1].reason == "unreadable_reply"
    assert server.methods() == ["turn/steer", "thread/turns/list"]


async def test_stale_turn_through_the_pair_is_rejected_and_sent_once():
    intent = make_intent()
    recorder = ledger_with(intent)
    server = FakeAppServer(turn__steer=RpcError(-32600, f"expected active turn id `{TURN}` but found `{NEXT_TURN}`"))
    adapter = adapter_for(recorder, server, grants("steer"))
    machine = Delivery(intent)
    await carry_out(machine, Dispatch(NOW, "a1"), recorder, adapter)
    await carry_out(machine, Dispatch(NOW + 1, "a2"), recorder, adapter)
    await carry_out(machine, Observed(TurnCompleted(thread_id=THREAD, turn_id=TURN), NOW + 2), recorder, adapter)
    view = intent_view(recorder, intent.id)
    assert (view.state, view.history[-1].reason, view.history[-1].evidence["found_turn_id"]) == (
        "rejected", "stale_turn", NEXT_TURN)
    assert server.methods() == ["turn/steer"]


async def test_timeout_through_the_pair_is_never_resent():
    intent = make_intent()
    recorder = ledger_with(intent)
    server = FakeAppServer(turn__steer=TimeoutError(), thread__turns__list={"data": [
        {"id": TURN, "status": "completed", "items": []}], "nextCursor": None})
    adapter = adapter_for(recorder, server, grants("steer"))
    machine = Delivery(intent)
    await carry_out(machine, Dispatch(NOW, "a1"), recorder, adapter)
    assert intent_view(recorder, intent.id).state == "dispatch_unknown"
    await carry_out(machine, Dispatch(NOW + 1, "a2"), recorder, adapter)
    await carry_out(machine, Observed(TurnCompleted(thread_id=THREAD, turn_id=TURN), NOW + 2), recorder, adapter)
    assert server.methods() == ["turn/steer", "thread/turns/list"]
    assert intent_view(recorder, intent.id).state == "expired"


async def test_a_second_stale_machine_cannot_send_a_second_copy():
    intent = make_intent("queue")
    recorder = ledger_with(intent)
    server = FakeAppServer(thread__queue__list={"data": []}, thread__queue__add={"queuedSubmission": {"id": "q1"}})
    adapter = adapter_for(recorder, server, grants("queue"))
    first, stale = Delivery(intent), Delivery(intent)  # both believe the intent is proposed
    await carry_out(first, Dispatch(NOW, "a1"), recorder, adapter)
    with pytest.raises(StaleDelivery):
        await carry_out(stale, Dispatch(NOW + 1, "a2"), recorder, adapter)
    assert server.methods() == ["thread/queue/list", "thread/queue/add"]
    assert intent_view(recorder, intent.id).state == "queued"


def thread_read(cwd) -> dict:
    """``thread/read``'s answer as the real server gives it (the thread, with its cwd)."""
    return {"thread": {"id": THREAD, "cwd": str(cwd), "status": {"type": "idle"}}, "readState": None}


async def test_verify_runs_the_readback_command_under_a_timeout(tmp_path):
    async def verify(command: str, verify_timeout: float = 5.0) -> Verified:
        intent = make_intent(verify=command)
        adapter = GuardedAdapter(FakeAppServer(thread__read=thread_read(tmp_path)), ledger_with(intent),
                                 grants("steer"), verify_timeout=verify_timeout, clock=lambda: NOW)
        return await adapter.execute(RunVerify(intent_id=intent.id, thread_id=THREAD, command=command))

    where = {"cwd_digest": digest(str(tmp_path))}
    assert await verify("exit 3") == Verified(3, NOW, **where)
    assert await verify("true") == Verified(0, NOW, **where)
    with anyio.fail_after(3):
        assert await verify("sleep 10", verify_timeout=0.3) == Verified(None, NOW, **where, error="timeout")


async def run_verify(adapter: GuardedAdapter, intent: Intent) -> Verified:
    return await adapter.execute(RunVerify(intent_id=intent.id, thread_id=THREAD, command=intent.verify))


async def test_verify_runs_in_the_threads_working_directory_not_the_daemons(tmp_path, monkeypatch):
    workspace, elsewhere = tmp_path / "ws", tmp_path / "daemon"
    (workspace / "build").mkdir(parents=True)
    (workspace / "build" / "ok").write_text("yes")
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    intent = make_intent(verify="test -f build/ok")
    server = FakeAppServer(thread__read=thread_read(workspace))
    adapter = GuardedAdapter(server, ledger_with(intent), grants("steer"), clock=lambda: NOW)
    assert await run_verify(adapter, intent) == Verified(0, NOW, cwd_digest=digest(str(workspace)))
    assert server.sent == [("thread/read", {"threadId": THREAD})]
    # the path itself is evidence only when payloads are retained
    adapter.retain_payloads = True
    assert await run_verify(adapter, intent) == Verified(0, NOW, cwd_digest=digest(str(workspace)),
                                                         cwd=str(workspace))


async def test_verify_in_a_thread_the_server_cannot_read_uses_the_directory_its_session_named(tmp_path):
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "ok").write_text("yes")
    intent = make_intent(verify="test -f build/ok")
    recorder = ledger_with(intent, ThreadStarted(thread_id=THREAD, source_format="codex_rollout",
                                                 cwd_digest=digest(str(tmp_path)), cwd=str(tmp_path)))
    server = FakeAppServer(thread__read=RpcError(-32600, f"thread not loaded: {THREAD}"))
    adapter = GuardedAdapter(server, recorder, grants("steer"), clock=lambda: NOW)
    assert await run_verify(adapter, intent) == Verified(0, NOW, cwd_digest=digest(str(tmp_path)))


@pytest.mark.parametrize("answer", [RpcError(-32600, "thread not loaded"), TimeoutError(), {"thread": {"id": THREAD}}])
async def test_verify_with_no_known_directory_runs_nothing(tmp_path, answer):
    marker = tmp_path / "ran"
    intent = make_intent(verify=f"touch {marker}")
    recorder = ledger_with(intent, ThreadStarted(thread_id=THREAD, cwd_digest=digest("/w")))  # the digest only
    adapter = GuardedAdapter(FakeAppServer(thread__read=answer), recorder, grants("steer"), clock=lambda: NOW)
    assert await run_verify(adapter, intent) == Verified(None, NOW, cwd_digest=None)
    assert not marker.exists()


async def test_verify_in_a_directory_that_is_gone_has_no_verdict(tmp_path):
    intent = make_intent(verify="true")
    gone = tmp_path / "gone"
    adapter = GuardedAdapter(FakeAppServer(thread__read=thread_read(gone)), ledger_with(intent), grants("steer"),
                             clock=lambda: NOW)
    verdict = await run_verify(adapter, intent)
    assert (verdict.exit_code, verdict.cwd_digest) == (None, digest(str(gone)))
    assert verdict.error.startswith("FileNotFoundError")


async def test_verify_runs_only_the_intents_own_readback_command():
    intent = make_intent(verify="true")
    adapter = GuardedAdapter(FakeAppServer(), ledger_with(intent), grants("steer"))
    with pytest.raises(CommandMismatch):
        await adapter.execute(RunVerify(intent_id=intent.id, thread_id=THREAD, command="rm -rf /tmp/x"))


async def test_a_settled_readback_goes_out_no_earlier_than_its_moment():
    """A stop's verifying reads name a moment (``not_before``, ``SETTLE`` seconds after its
    steps): the adapter holds it until then."""
    intent = make_intent("stop")
    recorder = ledger_with(intent)
    mark_dispatching(recorder, intent)
    asked_at: list[float] = []
    server = FakeAppServer(thread__turns__list=lambda _: asked_at.append(time.time()) or {"data": []})
    adapter = GuardedAdapter(server, recorder, grants("stop"))
    moment = time.time() + 0.3
    assert isinstance(await adapter.execute(ReadTurns(intent_id=intent.id, thread_id=THREAD, verifying=True,
                                                      not_before=moment)), Replied)
    assert len(asked_at) == 1 and asked_at[0] >= moment


async def test_a_readback_listing_a_turn_as_just_starting_is_read_again(monkeypatch):
    """Codex 0.171 lists a starting turn ``interrupted`` with ``completedAt: null`` for a few
    milliseconds: the adapter reads such a listing once more before the machine sees it."""
    from tillerman.controller.dispatch import turn_listing
    monkeypatch.setattr(turn_listing, "RELIST_AFTER", 0.0)
    intent = make_intent("queue")
    recorder = ledger_with(intent)
    mark_dispatching(recorder, intent)
    pages = iter([{"data": [{"id": NEXT_TURN, "status": "interrupted", "completedAt": None, "items": []}]},
                  {"data": [{"id": NEXT_TURN, "status": "inProgress", "completedAt": None, "items": []}]}])
    server = FakeAppServer(thread__turns__list=lambda _: next(pages))
    reply = await adapter_for(recorder, server, grants("queue")).execute(
        ReadBack(intent_id=intent.id, thread_id=THREAD, client_id=intent.client_user_message_id, turn_id=None))
    assert server.methods() == ["thread/turns/list", "thread/turns/list"]
    assert [turn.status for turn in reply.result.turns] == ["inProgress"]
