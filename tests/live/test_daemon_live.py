"""The whole daemon, in-process, beside a harness on the REAL Codex app-server (0.171.0 by default).

Each test runs ``tillerman.controller.daemon.daemon.Daemon`` (connection + brain + delivery tasks) with its
own SQLite ledger and a trace of every request it sends, next to a harness connection
that owns the threads. What reached the model is read from the scripted model's request
log; what landed in a turn, from the harness's own copy of the notifications.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import AppServer, held_command, is_item, text_input, watched_connection
from fixtures.rule_texts import grant, rule
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import (
    OWNER,
    OWNER_GRANT,
    SETTLED,
    reached_model,
    ruleset_from,
    session,
    wait_until,
)
from tillerman.controller.core import intent_requests
from tillerman.controller.core.boundary import Unauthorized
from tillerman.controller.core.commands import Steer
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Dispatch
from tillerman.controller.dispatch.adapter import GuardedAdapter
from tillerman.controller.dispatch.driver import carry_out
from tillerman.ledger.events import (
    ApprovalRequested,
    Conflict,
    ItemCompleted,
    ItemStarted,
    Report,
    ThreadNamed,
    TurnCompleted,
    TurnStarted,
    UserMessage,
)
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.jsonrpc import Notification, ServerRequest
from tillerman.rules.ruleset import Grant, build_ruleset

pytestmark = [pytest.mark.live, pytest.mark.anyio]

NO_RULES = ""


def transitions(view) -> list[tuple[str, str]]:
    return [(h.state, h.reason) for h in view.history if h.kind in ("proposed", "transition")]


def our_echoes(s, client_id: str) -> list[dict]:
    return [p for p in s.user_messages() if p["item"].get("clientId") == client_id]


# -- 1. positive control ---------------------------------------------------------------


async def test_granted_steer_lands_in_its_turn_is_acknowledged_and_verified(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        gate = workspace / "release"
        thread, turn = await s.start_command(workspace, held_command(gate))

        intent = intent_requests.propose(
            s.recorder, thread_id=thread, expected_turn=turn, mode="steer", owner=OWNER,
            text="Write the marker file. CREATE: marker.txt verified-by-readback",
            verify=f'test "$(cat {workspace}/marker.txt)" = verified-by-readback')
        await s.wait_state(intent.id, {"queued", *SETTLED})
        gate.touch()  # the command ends once the server took the steer: the turn goes on with it
        done = await s.wait_state(intent.id, {"effect_verified", "effect_failed", "expired", "rejected"})
        assert await s.turn_completed(thread, turn) == "completed"

        assert transitions(done) == [
            ("proposed", f"owner:{OWNER}"), ("dispatch_unknown", "dispatching"), ("queued", "accepted"),
            ("acknowledged", "echo"), ("effect_verified", "verify_passed")]
        [echo] = our_echoes(s, intent.client_user_message_id)
        assert echo["turnId"] == turn  # the userMessage with our clientId, in the expected turn
        acknowledged = next(h for h in done.history if h.state == "acknowledged")
        assert acknowledged.evidence == {"turn_id": turn, "item_id": echo["item"]["id"]}
        assert [m["params"]["expectedTurnId"] for m in s.sent("turn/steer")] == [turn]  # sent once
    assert reached_model(scripted_model, intent.id) >= 1
    assert (workspace / "marker.txt").read_text() == "verified-by-readback"


# -- 2. turn rollover before the steer --------------------------------------------------


async def test_steer_for_an_ended_turn_is_settled_without_a_send_while_the_next_turn_runs(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        thread = await s.start_thread(workspace)
        first = await s.start_turn(thread, "hello")
        assert await s.turn_completed(thread, first) == "completed"
        second = await s.start_turn(thread, "RUN: sleep 2")
        await wait_until(lambda: s.sees_command_started(thread, second), "the daemon to see the second turn")

        stale = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=first, mode="steer", owner=OWNER,
                                text="aimed at the ended turn zq1")
        settled = await s.wait_state(stale.id, SETTLED)
        assert (settled.state, settled.history[-1].reason) in {("expired", "turn_ended"), ("rejected", "stale_turn")}
        assert await s.turn_completed(thread, second) == "completed"
        assert s.intent(stale.id).state == settled.state  # final: never retried against the next turn
        assert our_echoes(s, stale.client_user_message_id) == []
        assert [m for m in s.sent("turn/steer") if m["params"]["expectedTurnId"] != first] == []
    assert reached_model(scripted_model, "aimed at the ended turn zq1") == 0


async def test_steers_racing_a_turn_rollover_never_land_on_the_next_turn(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    """Steers for turn 1 proposed around its end, with turn 2 queued to start the moment it
    ends: each one lands in turn 1, or is settled without landing; none reaches turn 2."""
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        thread = await s.start_thread(workspace)
        first = await s.start_turn(thread, "RUN: sleep 1")
        await s.harness.request("thread/queue/add", {"threadId": thread, "clientUserMessageId": "harness-next",
                                                     "input": text_input("RUN: sleep 1")})
        await wait_until(lambda: s.sees_command_started(thread, first), "the daemon to see turn 1's command")
        proposed = []
        for n in range(10):  # every 150 ms, from inside the command until after turn 1 ended
            await anyio.sleep(0.15)
            proposed.append(intent_requests.propose(s.recorder, thread_id=thread, expected_turn=first, mode="steer",
                                            owner=OWNER, text=f"race steer number r{n}x"))
        for intent in proposed:
            await s.wait_state(intent.id, SETTLED)
        queued = await s.log.wait_for(is_item("item/completed", "userMessage", clientId="harness-next"))
        second = queued.params["turnId"]
        assert second != first
        assert await s.turn_completed(thread, second) == "completed"
        await anyio.sleep(0.3)  # anything still pending would have landed by now

        outcomes = Counter()
        for intent in proposed:
            view = s.intent(intent.id)
            echoes = our_echoes(s, intent.client_user_message_id)
            outcomes[(view.state, view.history[-1].reason)] += 1
            if view.state == "acknowledged":
                assert [e["turnId"] for e in echoes] == [first]
            else:
                assert view.state in {"expired", "rejected"}, view.state
                assert echoes == []
                assert reached_model(scripted_model, intent.text) == 0
        assert all(p["item"].get("clientId") in (None, "harness-next") for p in s.user_messages(thread)
                   if p["turnId"] == second)
        assert {m["params"]["expectedTurnId"] for m in s.sent("turn/steer")} <= {first}
        # turn 1 ended while some were still to come: those were not sent at all
        assert outcomes[("expired", "turn_ended")] + outcomes[("rejected", "stale_turn")] \
            + outcomes[("rejected", "no_active_turn")] + outcomes[("expired", "not_delivered")] \
            + outcomes[("expired", "lost_after_accept")] >= 1, outcomes


# -- 3. accepted, then interrupted before delivery -------------------------------------


async def test_steer_accepted_then_interrupted_by_the_harness_expires_lost_after_accept(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        thread, turn = await s.start_command(workspace, held_command(workspace / "never"))  # interrupted below

        intent = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer", owner=OWNER,
                                 text="accepted but never heard zq3")
        await s.wait_state(intent.id, {"queued", *SETTLED})
        assert s.intent(intent.id).state == "queued"  # {"turnId"}: accepted, not delivered
        await s.harness.request("turn/interrupt", {"threadId": thread, "turnId": turn})
        assert await s.turn_completed(thread, turn) == "interrupted"
        done = await s.wait_state(intent.id, SETTLED)

        assert (done.state, done.history[-1].reason) in {("expired", "lost_after_accept"),
                                                         ("expired", "not_delivered")}
        assert "acknowledged" not in [h.state for h in done.history]
        reports = [r for r in s.events(Report) if r.detail.get("intent_id") == intent.id]
        assert [r.finding for r in reports] == ["lost_after_accept"]
        assert our_echoes(s, intent.client_user_message_id) == []
        assert len(s.sent("turn/steer")) == 1  # never resent
        assert s.sent("turn/interrupt") == []  # the harness interrupted, not tillerman
    assert reached_model(scripted_model, "accepted but never heard zq3") == 0


# -- 4. a reconnect mid-turn, and duplicate notifications --------------------------------


def _thread_messages(s, thread_id: str, start: int) -> list:
    return [m for m in s.log.messages[start:] if isinstance(m, Notification | ServerRequest)
            and m.params.get("threadId") == thread_id]


async def _deliver_again(s, messages: list) -> int:
    """The same notifications arrive a second time (the harness's copies of them), through
    the path the daemon's connection feeds: tap → brain inbox. Returns how many facts."""
    daemon, offered = s.daemon, 0
    for message in messages:
        out = daemon.tap.receive(message, time.time())
        if out.envelopes:
            offered += len(out.envelopes)
            await daemon._inbox_send.send(out.envelopes)
    await wait_until(lambda: daemon._inbox.statistics().current_buffer_used == 0, "the brain to take them")
    await anyio.sleep(0.1)
    return offered


async def test_reconnect_mid_turn_and_duplicate_notifications_record_each_fact_once(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        daemon = await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        thread = await s.start_thread(workspace)
        gate = workspace / "release"
        turn = await s.start_turn(thread, held_command(gate))
        await wait_until(lambda: any(e.turn_id == turn for e in s.events(TurnStarted)), "the daemon to subscribe")
        subscribed = len(s.log.messages)  # from here on, the daemon's connection got each of these too
        await wait_until(lambda: s.sees_command_started(thread, turn), "the daemon to see the command")
        intent = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer", owner=OWNER,
                                 text="delivered across a reconnect zq4")
        await s.wait_state(intent.id, {"queued", *SETTLED})
        resumes_before = len(s.sent("thread/resume"))

        # The daemon's connection drops in the middle of the turn (the command still runs).
        dropped = daemon.adapter.client
        await dropped._websocket.close()
        await wait_until(lambda: daemon.adapter is not None and daemon.adapter.client is not dropped
                         and daemon.connected.is_set(),
                         "the daemon to reconnect")
        await wait_until(lambda: len(s.sent("thread/resume")) > resumes_before, "the daemon to resubscribe")
        assert not any(m.method == "turn/completed" for m in _thread_messages(s, thread, 0))  # still mid-turn
        assert await _deliver_again(s, _thread_messages(s, thread, subscribed)) > 0  # everything so far, again

        gate.touch()
        assert await s.turn_completed(thread, turn) == "completed"
        await s.wait_state(intent.id, SETTLED)
        assert await _deliver_again(s, _thread_messages(s, thread, subscribed)) > 0  # again after the end

        entries = s.entries()
        facts = [e.envelope.event for e in entries if e.envelope.source.startswith("appserver")
                 and e.envelope.event.thread_id == thread]
        turns = Counter((type(e).__name__, e.turn_id) for e in facts if isinstance(e, TurnStarted | TurnCompleted))
        assert turns == {("TurnStarted", turn): 1, ("TurnCompleted", turn): 1}
        items = Counter((type(e).__name__, e.item_id) for e in facts
                        if isinstance(e, ItemStarted | ItemCompleted | UserMessage))
        assert items and max(items.values()) == 1, items
        assert sum(1 for e in facts if isinstance(e, UserMessage)
                   and e.client_id == intent.client_user_message_id) == 1
        assert [e.envelope.event for e in entries if isinstance(e.envelope.event, Conflict)] == []

        state = s.projection().threads[thread]
        assert state.turn_states == {turn: "completed"}  # folded once, and ended once
        assert (state.active_turn_id, state.running, state.approvals) == (None, {}, {})
        assert transitions(s.intent(intent.id)) == [
            ("proposed", f"owner:{OWNER}"), ("dispatch_unknown", "dispatching"), ("queued", "accepted"),
            ("acknowledged", "echo")]
        assert len(s.sent("turn/steer")) == 1
        assert len(s.sent("initialize")) == 2  # the original connection and the reconnect
    assert reached_model(scripted_model, "delivered across a reconnect zq4") >= 1


# -- 5. a human message interleaved with a steer ----------------------------------------


async def test_only_our_client_id_acknowledges_a_steer_interleaved_with_human_messages(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        gate = workspace / "release"
        thread, turn = await s.start_command(workspace, held_command(gate))

        # The human steers first, with their own clientUserMessageId, then tillerman, then
        # the human again with a plain message (no clientUserMessageId).
        await s.harness.request("turn/steer", {"threadId": thread, "expectedTurnId": turn,
                                               "clientUserMessageId": "human-1",
                                               "input": text_input("human note one")})
        intent = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer", owner=OWNER,
                                 text="tillerman steer zq5")
        await s.wait_state(intent.id, {"queued", *SETTLED})
        await s.harness.request("turn/steer", {"threadId": thread, "expectedTurnId": turn,
                                               "input": text_input("human plain note")})
        gate.touch()
        done = await s.wait_state(intent.id, SETTLED)
        assert await s.turn_completed(thread, turn) == "completed"
        await anyio.sleep(0.2)

        landed = [(p["item"].get("clientId"), p["turnId"]) for p in s.user_messages(thread)]
        ours = intent.client_user_message_id
        assert landed == [(None, turn), ("human-1", turn), (ours, turn), (None, turn)]
        [our_item] = [p["item"]["id"] for p in s.user_messages(thread) if p["item"].get("clientId") == ours]

        assert transitions(done) == [("proposed", f"owner:{OWNER}"), ("dispatch_unknown", "dispatching"),
                                     ("queued", "accepted"), ("acknowledged", "echo")]
        acknowledged = done.history[-1]
        assert acknowledged.evidence == {"turn_id": turn, "item_id": our_item}
        view = s.intent(intent.id)  # nothing moved it, nor was recorded for it, after our echo
        assert [h for h in view.history if h.kind in ("transition", "evidence") and h.seq > acknowledged.seq] == []
        human_items = {p["item"]["id"] for p in s.user_messages(thread) if p["item"].get("clientId") != ours}
        assert all(h.evidence.get("item_id") not in human_items for h in view.history)
        assert s.projection().threads[thread].client_ids == {ours: turn}  # the human's are not counted
        assert list(s.projection().intents) == [intent.id]
        # The ledger records every message sent after the daemon subscribed, each with its own
        # clientId (the prompt itself went by before the subscription).
        recorded = {e.item_id: e.client_id for e in s.events(UserMessage) if e.thread_id == thread}
        after_prompt = [(p["item"]["id"], p["item"].get("clientId")) for p in s.user_messages(thread)][1:]
        assert [(item, recorded.get(item, "missing")) for item, _ in after_prompt] == after_prompt
    assert reached_model(scripted_model, "human note one") >= 1  # the human's messages went through untouched
    assert reached_model(scripted_model, "human plain note") >= 1


# -- 6. approval waits and quiet critical commands are not hangs ------------------------

STALL_RULE = rule("stall", owner="tests", review_by="2027-06-01", condition={"kind": "turn_quiet", "for": "1s"},
                  action="interrupt", text="Turn {turn_id} was quiet for {quiet_for}: interrupting.")


async def test_approval_wait_and_quiet_critical_command_are_not_interrupted_as_hangs(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    async with session(app_server, tmp_path) as s:
        waiting = await s.start_thread(workspace, approvalPolicy="untrusted")
        critical = await s.start_thread(workspace)
        control = await s.start_thread(workspace)  # an ordinary quiet command: the rule must fire
        grants = grant("rule:stall", ["interrupt"], threads=[waiting, critical, control])
        await s.start_daemon(ruleset_from(tmp_path, STALL_RULE, grants))
        waiting_turn = await s.start_turn(waiting, "RUN: echo approved-zq6")
        critical_turn = await s.start_turn(critical, "RUN: sleep 3 # migrate")  # a default critical pattern
        control_turn = await s.start_turn(control, "RUN: sleep 3")

        approval = await s.log.wait_for(lambda m: isinstance(m, ServerRequest) and m.params["threadId"] == waiting)
        await wait_until(lambda: any(e.thread_id == waiting for e in s.events(ApprovalRequested)),
                         "the daemon to record the approval wait")
        await wait_until(lambda: any(e.thread_id == critical and e.critical for e in s.events(ItemStarted)),
                         "the daemon to record the critical command")
        await anyio.sleep(3.0)  # the harness leaves the approval unanswered: 3x the quiet threshold
        assert s.projection().snapshot(waiting).approval_pending
        await s.harness.answer(approval, {"decision": "accept"})

        assert await s.turn_completed(waiting, waiting_turn) == "completed"
        assert await s.turn_completed(critical, critical_turn) == "completed"
        assert await s.turn_completed(control, control_turn) == "interrupted"
        [stop] = [v for v in s.projection().intents.values() if v.intent.thread_id == control]
        assert (stop.intent.producer, stop.intent.mode, stop.intent.expected_turn_id) == (
            "rule:stall", "interrupt", control_turn)
        await s.wait_state(stop.intent.id, {"acknowledged"})

        for thread in (waiting, critical):
            assert [v for v in s.projection().intents.values() if v.intent.thread_id == thread] == []
            assert [m for m in s.sent() if (m.get("params") or {}).get("threadId") == thread
                    and m["method"] in ("turn/interrupt", "turn/steer", "thread/queue/add")] == []
            assert [r for r in s.events(Report) if r.thread_id == thread] == []
        assert [m["params"]["threadId"] for m in s.sent("turn/interrupt")] == [control]
    assert sum(1 for r in scripted_model.requests if "approved-zq6" in (r.reply or "")) >= 1


# -- 7. a well-formed intent without a grant is refused at the adapter ------------------


async def test_intent_without_a_grant_is_refused_at_the_adapter_and_by_the_daemon(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path, tmp_path: Path
) -> None:
    sent_by_adapter: list[dict] = []

    def trace(direction: str, message) -> None:
        if direction == "out":
            sent_by_adapter.append(message)

    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        gate = workspace / "release"
        thread, turn = await s.start_command(workspace, held_command(gate))
        requests_before = len(scripted_model.requests)

        # The adapter alone, over its own connection and ledger: the ledger shows the intent
        # dispatch_unknown under this very attempt, but its producer holds no grant.
        ledger = SQLiteRecorder(tmp_path / "adapter.sqlite3")
        async with watched_connection(app_server.url, client_name="adapter", trace=trace) as (client, _):
            adapter = GuardedAdapter(client, ledger, build_ruleset((), (
                Grant(subject=f"owner:{OWNER}", actions=frozenset({"steer"})),)), timeout=5.0)
            mallory = intent_requests.propose(ledger, thread_id=thread, expected_turn=turn, mode="steer",
                                      owner="mallory", text="delete the tests zq7a")
            intent_requests.transition(ledger, mallory.id, State.DISPATCH_UNKNOWN, "dispatching",
                               {"attempt": "attempt-1", "mode": "steer"}, durable=True)
            steer = Steer(intent_id=mallory.id, thread_id=thread, expected_turn_id=turn,
                          client_user_message_id=mallory.client_user_message_id, text=mallory.delivered_text,
                          attempt="attempt-1")
            with pytest.raises(Unauthorized):
                await adapter.execute(steer)
            # Control: the same command under a rule set granting mallory passes every check.
            GuardedAdapter(client, ledger, build_ruleset((), (
                Grant(subject="owner:mallory", actions=frozenset({"steer"})),))).check(steer)

            # The delivery machine's own dispatch: recorded, refused at the boundary, rejected.
            second = intent_requests.propose(ledger, thread_id=thread, expected_turn=turn, mode="steer",
                                     owner="mallory", text="delete the tests zq7b")
            machine = Delivery(second)
            await carry_out(machine, Dispatch(time.time(), "attempt-2"), ledger, adapter)
            view = intent_requests.intent_view(ledger, second.id)
            assert transitions(view)[1:] == [("dispatch_unknown", "dispatching"), ("rejected", "refused")]
            assert view.history[-1].evidence["boundary"] == "unauthorized"
            assert [m.get("method") for m in sent_by_adapter] == ["initialize", "initialized"]
        ledger.close()

        # Through the daemon: an owner with no grant is rejected before any request.
        unauthorized = intent_requests.propose(s.recorder, thread_id=thread, expected_turn=turn, mode="steer",
                                       owner="mallory", text="delete the tests zq7c")
        done = await s.wait_state(unauthorized.id, SETTLED)
        assert (done.state, done.history[-1].reason) == ("rejected", "no_grant")
        assert "dispatch_unknown" not in [h.state for h in done.history]
        gate.touch()
        assert await s.turn_completed(thread, turn) == "completed"
        assert s.sent("turn/steer") == []
        for intent in (mallory, second, unauthorized):
            assert our_echoes(s, intent.client_user_message_id) == []
        assert [p["item"].get("clientId") for p in s.user_messages(thread)] == [None]  # only the prompt
    assert reached_model(scripted_model, "delete the tests") == 0
    assert len(scripted_model.requests) > requests_before  # the turn itself went on


async def test_a_name_set_on_a_supervised_thread_is_recorded_as_its_title(
    app_server: AppServer, workspace: Path, tmp_path: Path
) -> None:
    """The owner's ``thread/name/set`` reaches the daemon's ledger as ``thread_named``,
    which the fleet names the thread by."""
    async with session(app_server, tmp_path) as s:
        await s.start_daemon(ruleset_from(tmp_path, NO_RULES, OWNER_GRANT))
        thread, turn = await s.start_command(workspace, "RUN: sleep 1")
        await wait_until(lambda: s.sees_command_started(thread, turn), "the daemon to see the turn")
        await s.harness.request("thread/name/set", {"threadId": thread, "name": "Fix the checkout test"})
        named = await wait_until(lambda: s.events(ThreadNamed), "the title in the ledger")
        assert [(e.thread_id, e.name) for e in named] == [(thread, "Fix the checkout test")]
        await s.turn_completed(thread, turn)
