"""tillerman's connection beside a harness on the REAL Codex app-server (0.171.0 by default).

The harness owns each thread; the supervisor (a second connection, as tillerman runs)
discovers it from broadcasts, subscribes with thread/resume and acts on it. These tests
pin down the facts of reference/codex-app-server.md that the design relies on.
"""

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from fixtures.codex_server import (
    AppServer,
    EventLog,
    HarnessClient,
    codex_version,
    is_item,
    is_notification,
    text_input,
    watched_connection,
)
from fixtures.record_sessions import record
from fixtures.scripted_model import ScriptedModel
from tests.live.daemon_support import wait_until
from tillerman.ledger.events import ThreadNamed
from tillerman.monitor.appserver_client import AppServerClient
from tillerman.monitor.appserver_events import AppServerEvents
from tillerman.monitor.jsonrpc import RpcError, ServerRequest

pytestmark = [pytest.mark.live, pytest.mark.anyio]

INTENT_ID = "in-0123456789abcdef0123"
QUEUED_INTENT_ID = "in-0123456789abcdef0456"


@asynccontextmanager
async def _harness_and_supervisor(
    server: AppServer, supervisor_trace: Any = None
) -> AsyncIterator[tuple[HarnessClient, EventLog, AppServerClient, EventLog]]:
    # The harness initializes first: the first client names every thread's originator.
    async with watched_connection(
        server.url, client_name="harness", client_class=HarnessClient
    ) as (harness, harness_log), watched_connection(server.url, trace=supervisor_trace) as (
        supervisor,
        supervisor_log,
    ):
        yield harness, harness_log, supervisor, supervisor_log


async def _start_turn(harness: HarnessClient, workspace: Path, prompt: str, **thread_params: Any) -> tuple[dict, str]:
    started = await harness.request("thread/start", {"cwd": str(workspace), **thread_params})
    thread_id = started["thread"]["id"]
    turn = await harness.request("turn/start", {"threadId": thread_id, "input": text_input(prompt)})
    return started["thread"], turn["turn"]["id"]


async def _subscribe(supervisor: AppServerClient, log: EventLog, thread_id: str) -> str:
    """Discovery from the broadcast status change, then thread/resume; returns the active turn id."""
    await log.wait_for(
        is_notification(
            "thread/status/changed", threadId=thread_id, status={"type": "active", "activeFlags": []}
        )
    )
    resumed = await supervisor.request(
        "thread/resume",
        {"threadId": thread_id, "excludeTurns": True, "initialTurnsPage": {"limit": 1}},
    )
    [turn] = resumed["initialTurnsPage"]["data"]
    assert turn["status"] == "inProgress"
    return turn["id"]


def _turn_completed(thread_id: str, turn_id: str):
    def matches(message: Any) -> bool:
        return is_notification("turn/completed", threadId=thread_id)(message) and (
            message.params["turn"]["id"] == turn_id
        )

    return matches


async def _steer(client: AppServerClient, thread_id: str, expected_turn_id: str, text: str, **extra: Any) -> Any:
    return await client.request(
        "turn/steer",
        {"threadId": thread_id, "expectedTurnId": expected_turn_id, "input": text_input(text), **extra},
    )


async def test_supervisor_steers_a_running_turn_and_sees_delivery(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path
) -> None:
    async with _harness_and_supervisor(app_server) as (harness, harness_log, supervisor, log):
        thread, turn_id = await _start_turn(harness, workspace, "RUN: sleep 3")
        assert await _subscribe(supervisor, log, thread["id"]) == turn_id
        # Steer while the command runs (a steer before the first model reply would land in
        # a restarted first request instead, and the command would never run).
        await log.wait_for(is_item("item/started", "commandExecution"))

        steered_at = time.monotonic()
        accepted = await _steer(
            supervisor, thread["id"], turn_id, f"[tillerman {INTENT_ID}] also run the linter",
            clientUserMessageId=INTENT_ID,
        )
        assert accepted == {"turnId": turn_id}  # accepted, not yet delivered

        with pytest.raises(RpcError) as mismatch:
            await _steer(supervisor, thread["id"], "bogus-turn-id", "never delivered")
        assert (mismatch.value.code, mismatch.value.message) == (
            -32600,
            f"expected active turn id `bogus-turn-id` but found `{turn_id}`",
        )

        # Delivery: the userMessage item carrying our clientId, seen by both connections,
        # only once the running command has finished.
        delivered = await log.wait_for(is_item("item/completed", "userMessage", clientId=INTENT_ID))
        assert time.monotonic() - steered_at > 2.0
        assert delivered.params["turnId"] == turn_id
        await harness_log.wait_for(is_item("item/completed", "userMessage", clientId=INTENT_ID))
        await log.wait_for(is_item("item/completed", "agentMessage", text=f"ack {INTENT_ID}: will do"))
        completed = await log.wait_for(_turn_completed(thread["id"], turn_id))
        assert completed.params["turn"]["status"] == "completed"

        with pytest.raises(RpcError) as idle:
            await _steer(supervisor, thread["id"], turn_id, "too late")
        assert (idle.value.code, idle.value.message) == (-32600, "no active turn to steer")

    steered_requests = [r for r in scripted_model.requests if r.last_user_text and INTENT_ID in r.last_user_text]
    assert len(steered_requests) == 1  # the failed steers reached nobody

    rollout = Path(thread["path"])
    assert rollout.is_file() and rollout.is_relative_to(app_server.sessions_dir)
    records = [json.loads(line) for line in rollout.read_text().splitlines()]
    assert records[0]["type"] == "session_meta"
    assert any(
        r["type"] == "event_msg" and r["payload"].get("item", {}).get("client_id") == INTENT_ID
        for r in records
    )


async def test_a_waiting_model_holds_its_turn_until_released_or_steered(
    app_server: AppServer, scripted_model: ScriptedModel, workspace: Path
) -> None:
    """``WAIT: <path>`` holds a turn by a file, not by time: it ends once the file exists,
    or at once when a steer makes Codex abandon the held model call (0.163; 0.153 lets
    the call finish and delivers the steer after it, so there the file releases it)."""
    abandons = codex_version() >= (0, 163)
    released, steered = workspace / "release-one", workspace / "release-other"
    async with _harness_and_supervisor(app_server) as (harness, log, _, _):
        held_thread, held_turn = await _start_turn(harness, workspace, f"WAIT: {released}")
        steered_thread, steered_turn = await _start_turn(harness, workspace, f"WAIT: {steered}")

        def holding(path: Path) -> list:
            return [r for r in scripted_model.requests if r.last_user_text == f"WAIT: {path}"]

        await wait_until(lambda: holding(released) and holding(steered), "the model to hold both turns")
        await _steer(harness, steered_thread["id"], steered_turn, f"[tillerman {INTENT_ID}] carry on",
                     clientUserMessageId=INTENT_ID)
        if not abandons:
            steered.touch()
        await log.wait_for(is_item("item/completed", "agentMessage", text=f"ack {INTENT_ID}: will do"))
        ended = await log.wait_for(_turn_completed(steered_thread["id"], steered_turn))
        assert ended.params["turn"]["status"] == "completed"
        if abandons:
            await wait_until(lambda: holding(steered)[0].abandoned, "the script to see the abandoned call")

        assert not any(_turn_completed(held_thread["id"], held_turn)(m) for m in log.messages)  # still held
        released.touch()
        await log.wait_for(is_item("item/completed", "agentMessage", text=f"released: {released}"))
        ended = await log.wait_for(_turn_completed(held_thread["id"], held_turn))
        assert ended.params["turn"]["status"] == "completed"
        assert not holding(released)[0].abandoned


async def test_interrupt_ends_the_turn_but_the_command_runs_until_terminated(
    app_server: AppServer, workspace: Path
) -> None:
    marker = workspace / "side-effect"
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread, turn_id = await _start_turn(harness, workspace, f"RUN: sleep 2; touch {marker.name}")
        await _subscribe(supervisor, log, thread["id"])
        command = await log.wait_for(is_item("item/started", "commandExecution"))
        command_started = time.monotonic()

        assert await supervisor.request("turn/interrupt", {"threadId": thread["id"], "turnId": turn_id}) == {}
        completed = await log.wait_for(_turn_completed(thread["id"], turn_id))
        assert completed.params["turn"]["status"] == "interrupted"

        terminals = await supervisor.request("thread/backgroundTerminals/list", {"threadId": thread["id"]})
        [terminal] = terminals["data"]
        assert terminal["itemId"] == command.params["item"]["id"]  # still running after the interrupt
        terminate = {"threadId": thread["id"], "processId": terminal["processId"]}
        assert await supervisor.request("thread/backgroundTerminals/terminate", terminate) == {"terminated": True}
        assert await supervisor.request("thread/backgroundTerminals/terminate", terminate) == {"terminated": False}

        late = await log.wait_for(is_item("item/completed", "commandExecution", id=terminal["itemId"]))
        assert late.params["item"]["status"] == "failed"
        assert late.params["turnId"] == turn_id
        await anyio.sleep(max(0.0, 2.5 - (time.monotonic() - command_started)))
        assert not marker.exists()


async def test_queued_entry_waits_for_the_active_turn_and_runs_after(
    app_server: AppServer, workspace: Path
) -> None:
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread, first_turn = await _start_turn(harness, workspace, "RUN: sleep 2")
        await _subscribe(supervisor, log, thread["id"])
        added = await supervisor.request(
            "thread/queue/add",
            {"threadId": thread["id"], "clientUserMessageId": QUEUED_INTENT_ID, "input": text_input("RUN: sleep 1")},
        )
        assert added["queuedSubmission"]["clientUserMessageId"] == QUEUED_INTENT_ID
        queue = await supervisor.request("thread/queue/list", {"threadId": thread["id"]})
        assert [e["id"] for e in queue["data"]] == [added["queuedSubmission"]["id"]]

        first_done = await log.wait_for(_turn_completed(thread["id"], first_turn))
        second_started = await log.wait_for(is_notification("turn/started", threadId=thread["id"]), start=0)
        assert log.messages.index(first_done) < log.messages.index(second_started)  # never merged in
        second_turn = second_started.params["turn"]["id"]
        assert second_turn != first_turn
        await log.wait_for(is_item("item/completed", "userMessage", clientId=QUEUED_INTENT_ID))

        with pytest.raises(RpcError) as stale:
            await _steer(supervisor, thread["id"], first_turn, "aimed at the finished turn")
        assert (stale.value.code, stale.value.message) == (
            -32600,
            f"expected active turn id `{first_turn}` but found `{second_turn}`",
        )
        assert (await log.wait_for(_turn_completed(thread["id"], second_turn))).params["turn"]["status"] == "completed"
        assert (await supervisor.request("thread/queue/list", {"threadId": thread["id"]}))["data"] == []


async def test_supervisor_observes_approval_requests_and_never_answers(
    app_server: AppServer, workspace: Path
) -> None:
    sent: list[Any] = []
    trace = lambda direction, message: sent.append(message) if direction == "out" else None  # noqa: E731
    async with _harness_and_supervisor(app_server, supervisor_trace=trace) as (harness, harness_log, supervisor, log):
        thread, turn_id = await _start_turn(harness, workspace, "RUN: echo approved", approvalPolicy="untrusted")
        await _subscribe(supervisor, log, thread["id"])
        seen = await log.wait_for(lambda m: isinstance(m, ServerRequest))
        assert seen.method == "item/commandExecution/requestApproval"
        assert seen.params["turnId"] == turn_id
        await log.wait_for(
            is_notification(
                "thread/status/changed",
                threadId=thread["id"],
                status={"type": "active", "activeFlags": ["waitingOnApproval"]},
            )
        )
        owned = await harness_log.wait_for(lambda m: isinstance(m, ServerRequest))
        assert owned.id == seen.id  # the same request, same id, on every subscriber

        await harness.answer(owned, {"decision": "accept"})
        await log.wait_for(is_notification("serverRequest/resolved", requestId=seen.id))
        await log.wait_for(_turn_completed(thread["id"], turn_id))
    assert not [m for m in sent if "result" in m or "error" in m]


async def test_recorded_session_regenerates(tmp_path: Path) -> None:
    session = await record(tmp_path)
    trace = [json.loads(line) for line in (tmp_path / "appserver-trace" / "live-supervised.jsonl").open()]
    sent = [r["msg"].get("method") for r in trace if r["dir"] == "out"]
    received = {r["msg"].get("method") for r in trace if r["dir"] == "in"}
    for method in ("thread/resume", "turn/steer", "thread/queue/add", "turn/interrupt", "thread/queue/start"):
        assert method in sent
    assert {"item/commandExecution/requestApproval", "serverRequest/resolved"} <= received
    assert None not in sent  # requests and notifications only: no answers
    rollout = (tmp_path / "codex-rollout" / "live-0.163-supervised.jsonl").read_text()
    assert session.thread_id in rollout and "<WORKSPACE>" in rollout
    assert str(Path.home()) + "/" not in rollout



async def test_a_name_the_harness_sets_reaches_the_supervisor_as_the_threads_title(
    app_server: AppServer, workspace: Path
) -> None:
    """``thread/name/set`` from the owner is broadcast as ``thread/name/updated`` to the
    subscribed supervisor, which records it as the thread's title; ``thread/read`` then
    carries it as the thread's ``name`` (how a supervisor attaching later learns it)."""
    async with _harness_and_supervisor(app_server) as (harness, _, supervisor, log):
        thread, turn_id = await _start_turn(harness, workspace, "RUN: sleep 1")
        await _subscribe(supervisor, log, thread["id"])
        await harness.request("thread/name/set", {"threadId": thread["id"], "name": "Fix the checkout test"})
        named = await log.wait_for(is_notification("thread/name/updated", threadId=thread["id"]))
        events = AppServerEvents().normalize({"method": named.method, "params": named.params})
        assert events == [ThreadNamed(thread_id=thread["id"], name="Fix the checkout test")]
        read = await supervisor.request("thread/read", {"threadId": thread["id"]})
        assert ThreadNamed(thread_id=thread["id"], name="Fix the checkout test") in AppServerEvents().response(
            "thread/read", read)
        await log.wait_for(_turn_completed(thread["id"], turn_id))
