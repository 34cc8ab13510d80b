"""tillerman beside the REAL interactive Codex TUI (0.171.0 by default), driven in tmux, offline.

A person types into ``codex --remote unix://`` (or plain ``codex`` on Codex's managed
daemon); tillerman's daemon runs in-process on the same server's default control socket,
started BEFORE the TUI, with its own ledger and a trace of every message it sent and got.
A third client (the session's ``harness``, here a plain observer) reads the server's own
record of the thread. What the person sees is the tmux pane (``fixtures.tui``); what
reached the model, the scripted model's request log.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import anyio
import pytest

from fixtures.codex_server import codex_version, make_codex_home
from fixtures.scripted_model import ScriptedModel
from fixtures.tui import (
    DefaultSocketServer,
    ManagedDaemon,
    TmuxUnavailable,
    Tui,
    default_socket,
    ensure_tmux,
    git_workspace,
)
from tests.live.daemon_support import SETTLED, Session, daemon_first, wait_until
from tillerman.controller.cli.main import load_rules_or_fail
from tillerman.controller.core import intent_requests
from tillerman.ledger.events import (
    ApprovalRequested,
    ApprovalResolved,
    DecisionRecorded,
    IntentProposed,
    Report,
    ThreadStarted,
    TurnCompleted,
)
from tillerman.monitor.codex_home import resolve_target
from tillerman.rules.owner import local_login

pytestmark = [pytest.mark.live, pytest.mark.anyio]

OWNER = local_login()  # no configuration: the built-in grant lets the local owner steer


def tillerman_attach(codex_home: Path) -> dict:
    """What a bare ``tillerman run`` (no --codex, no --client-name) attaches to with this
    CODEX_HOME: Codex's default control socket, under the TUI's own client name, so that
    initializing first does not brand the TUI's threads."""
    target = resolve_target(None, None, {"CODEX_HOME": str(codex_home)})
    assert target.url == f"unix://{default_socket(codex_home)}"
    return {"url": target.url, "client_name": target.client_name, "default_socket": target.default_socket}


def no_config_ruleset():
    """The rule set ``tillerman run`` runs with when no config file exists."""
    return load_rules_or_fail(None, None).ruleset


# The oldest release whose TUI these tests were seen to pass on: 0.163.0 and 0.171.0 pass;
# on 0.153.4 all three fail, its npm and its PyPI build alike (there `codex app-server
# daemon start` wants a standalone install, and the TUI's thread does not show as on 0.163).
TUI_SINCE = (0, 163)


@pytest.fixture(autouse=True)
def _a_tui_these_tests_know() -> None:
    if codex_version() < TUI_SINCE:
        pytest.skip(f"the TUI tests need Codex {'.'.join(map(str, TUI_SINCE))} or later")


@pytest.fixture
def tmux() -> str:
    try:
        return ensure_tmux()
    except TmuxUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def codex_home(scripted_model: ScriptedModel) -> Iterator[Path]:
    home = make_codex_home(scripted_model.base_url)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


async def in_thread(call, *args):
    """Run a blocking TUI helper (it polls tmux) without stalling the in-process daemon."""
    return await anyio.to_thread.run_sync(partial(call, *args))


async def tui_thread(s: Session) -> dict:
    """The TUI's conversation, as the server lists it: loaded, not ephemeral, from a user."""
    loaded = await s.harness.request("thread/loaded/list", {})
    threads = [(await s.harness.request("thread/read", {"threadId": t}))["thread"] for t in loaded["data"]]
    [thread] = [t for t in threads if not t["ephemeral"] and t["threadSource"] == "user"]
    return thread


async def title_threads(s: Session, timeout: float = 20.0) -> list[str]:
    """The TUI's ephemeral title-generation threads (one or two per turn; they stay
    loaded), once there is one: the TUI starts them beside its turn, and on a busy
    machine the first may start after the turn has ended."""
    with anyio.move_on_after(timeout):
        while True:
            loaded = await s.harness.request("thread/loaded/list", {})
            threads = [(await s.harness.request("thread/read", {"threadId": t}))["thread"] for t in loaded["data"]]
            if titles := [t["id"] for t in threads if t["ephemeral"] and t["threadSource"] == "thread_title"]:
                return titles
            await anyio.sleep(0.1)
    return []


async def server_user_messages(s: Session, thread_id: str, turn_id: str) -> list[dict]:
    """The turn's userMessage items, as the server stored them."""
    turns = await s.harness.request("thread/turns/list", {"threadId": thread_id, "limit": 10, "itemsView": "full"})
    [turn] = [t for t in turns["data"] if t["id"] == turn_id]
    return [i for i in turn["items"] if i["type"] == "userMessage"]


def with_client_id(items: list[dict], client_id: str) -> list[dict]:
    return [i for i in items if i.get("clientId") == client_id]


def model_copies(model: ScriptedModel, text: str) -> list[int]:
    """For each model request that holds ``text``: how many of its user messages hold it."""
    return [sum(text in t for t in r.user_texts) for r in model.requests if text in json.dumps(r.body)]


def turn_ended(s: Session, turn_id: str) -> bool:
    return any(e.turn_id == turn_id for e in s.events(TurnCompleted))


def assert_nothing_decided_for(s: Session, thread_ids: list[str]) -> None:
    """The ledger holds no intent, decision or report for these threads."""
    assert [e for e in s.events(IntentProposed) + s.events(DecisionRecorded) + s.events(Report)
            if e.thread_id in thread_ids] == []


def assert_not_supervised(s: Session, thread_ids: list[str]) -> None:
    """tillerman leaves these threads alone: nothing decided for them, and no subscription."""
    assert_nothing_decided_for(s, thread_ids)
    resumed = [m["params"]["threadId"] for m in s.sent("thread/resume")]
    assert [t for t in resumed if t in thread_ids] == []


# -- the TUI on a shared server (codex --remote unix://) --------------------------------


@pytest.fixture
async def tui_session(tmux: str, codex_home: Path, tmp_path: Path):
    """tillerman first, then the TUI on ``codex app-server --listen unix://``."""
    workspace = git_workspace(codex_home / "ws")
    with DefaultSocketServer(codex_home, workspace) as server:
        async with daemon_first(server, tmp_path, no_config_ruleset(), **tillerman_attach(codex_home)) as s:
            with Tui(codex_home, workspace) as tui:
                await in_thread(tui.wait_ready)
                yield s, tui, workspace


async def test_tui_thread_takes_one_steer_no_stale_one_and_its_approval_from_the_person(tui_session, scripted_model) -> None:
    s, tui, workspace = tui_session
    thread = await tui_thread(s)
    assert thread["originator"] == "codex-tui"  # though tillerman initialized first
    assert s.daemon.link.originator == "codex-tui" and s.daemon.link.first_initializer is None  # status says so
    thread_id = thread["id"]

    # The person asks for a long command; tillerman steers the running turn.
    await in_thread(tui.submit, "RUN: sleep 8")
    turn = await wait_until(lambda: s.projection().snapshot(thread_id).active_turn_id, "the ledger to see the turn")
    await wait_until(lambda: s.sees_command_started(thread_id, turn), "the ledger to see the command run")
    steer = intent_requests.propose(s.recorder, thread_id=thread_id, expected_turn="active", mode="steer", owner=OWNER,
                            text="Steer from tillerman: also list the workspace zt1")
    assert steer.expected_turn_id == turn
    done = await s.wait_state(steer.id, SETTLED)
    assert done.state == "acknowledged"
    await in_thread(tui.wait_for, "Steer from tillerman: also list the workspace zt1")  # the person sees it
    screen = await in_thread(tui.wait_for, f"ack {steer.id}")  # and the model's answer to it
    await wait_until(lambda: turn_ended(s, turn), "the turn to end")

    assert len(with_client_id(await server_user_messages(s, thread_id, turn), steer.client_user_message_id)) == 1
    assert set(model_copies(scripted_model, steer.id)) == {1}  # in every later request, once
    assert [m["params"]["expectedTurnId"] for m in s.sent("turn/steer")] == [turn]  # sent once
    print("\n--- TUI after the steer ---\n" + screen.rstrip())

    # The person lets the thread ask before running commands (a second client may: the TUI
    # itself cannot choose "untrusted"), then asks for one.
    await s.harness.request("thread/settings/update", {"threadId": thread_id, "approvalPolicy": "untrusted"})
    await in_thread(tui.submit, "RUN: touch approved-by-a-person")
    await wait_until(lambda: any(e.thread_id == thread_id for e in s.events(ApprovalRequested)),
                     "the ledger to see the approval request")
    screen = await in_thread(tui.wait_for, "Would you like to run the following command?")
    print("\n--- TUI asking for approval ---\n" + screen.rstrip())
    assert s.projection().snapshot(thread_id).approval_pending
    second = s.projection().snapshot(thread_id).active_turn_id
    assert second not in (None, turn)

    # A steer for the turn that ended is never delivered, not even into the running one.
    stale = intent_requests.propose(s.recorder, thread_id=thread_id, expected_turn=turn, mode="steer", owner=OWNER,
                            text="Stale steer for an ended turn zt2")
    settled = await s.wait_state(stale.id, SETTLED)
    assert settled.state in {"expired", "rejected"}

    # tillerman saw the request and did not answer it; the person answers in the TUI.
    [asked] = [m for m in s.traced("in") if m.get("method") == "item/commandExecution/requestApproval"]
    assert [m for m in s.traced("out") if "method" not in m and m.get("id") == asked["id"]] == []
    await in_thread(tui.press, "y")
    await wait_until(lambda: any(e.thread_id == thread_id for e in s.events(ApprovalResolved)),
                     "the ledger to see the approval settled")
    screen = await in_thread(tui.wait_for, "You approved codex to run")
    print("\n--- TUI after the person approved ---\n" + screen.rstrip())
    await wait_until(lambda: turn_ended(s, second), "the approved turn to end")
    assert (workspace / "approved-by-a-person").exists()
    assert not s.projection().snapshot(thread_id).approval_pending
    assert [m for m in s.traced("out") if "method" not in m and m.get("id") == asked["id"]] == []

    for turn_id in (turn, second):
        assert with_client_id(await server_user_messages(s, thread_id, turn_id), stale.client_user_message_id) == []
    assert model_copies(scripted_model, stale.id) == []
    assert model_copies(scripted_model, "Stale steer for an ended turn zt2") == []
    assert [m["params"]["expectedTurnId"] for m in s.sent("turn/steer")] == [turn]

    titles = await title_threads(s)
    assert titles  # the TUI names its conversation with throwaway threads of its own
    assert_nothing_decided_for(s, titles)


async def test_tui_title_generation_threads_are_not_supervised(tui_session) -> None:
    s, tui, _ = tui_session
    thread_id = (await tui_thread(s))["id"]
    await in_thread(tui.submit, "hello from the person")
    await in_thread(tui.wait_for, "ok: hello from the person")
    await wait_until(lambda: any(e.thread_id == thread_id for e in s.events(TurnCompleted)),
                     "the ledger to see the turn end")
    titles = await title_threads(s)
    assert titles
    assert_not_supervised(s, titles)
    recorded = {e.thread_id: e for e in s.events(ThreadStarted) if e.thread_id in titles}
    assert set(recorded) == set(titles) and all(e.ephemeral for e in recorded.values())  # recorded, as such


# -- the TUI on Codex's managed daemon (plain `codex`) -------------------------------


async def test_tui_on_the_managed_daemon_takes_one_steer(tmux: str, codex_home: Path, tmp_path: Path,
                                                         scripted_model: ScriptedModel) -> None:
    """``codex app-server daemon start``, tillerman on its socket, then plain ``codex``,
    which finds the daemon by itself (and asks to trust the git working directory)."""
    workspace = git_workspace(codex_home / "ws")
    with ManagedDaemon(codex_home) as daemon:
        assert json.loads(daemon.started)["status"] == "started"
        async with daemon_first(daemon, tmp_path, no_config_ruleset(), **tillerman_attach(codex_home)) as s:
            with Tui(codex_home, workspace, args="") as tui:
                await in_thread(tui.wait_ready)
                assert tui.trusted_folder  # plain `codex` in a git repository asks first
                thread = await tui_thread(s)
                # tillerman initialized before anyone else (`daemon start` does not), under the
                # TUI's name; when plain `codex` finds the daemon first, its probe connection
                # (`codex_app_server_daemon`) names the process instead.
                assert thread["originator"] == "codex-tui"
                assert thread["cwd"] == str(workspace)
                thread_id = thread["id"]

                await in_thread(tui.submit, "RUN: sleep 3")
                turn = await wait_until(lambda: s.projection().snapshot(thread_id).active_turn_id,
                                        "the ledger to see the turn")
                await wait_until(lambda: s.sees_command_started(thread_id, turn), "the ledger to see the command run")
                steer = intent_requests.propose(s.recorder, thread_id=thread_id, expected_turn="active", mode="steer",
                                        owner=OWNER, text="Steer from tillerman via the daemon zt3")
                done = await s.wait_state(steer.id, SETTLED)
                assert done.state == "acknowledged"
                screen = await in_thread(tui.wait_for, f"ack {steer.id}")
                assert "Steer from tillerman via the daemon zt3" in screen
                await wait_until(lambda: turn_ended(s, turn), "the turn to end")
                print("\n--- TUI on the managed daemon ---\n" + screen.rstrip())

                assert len(with_client_id(await server_user_messages(s, thread_id, turn),
                                          steer.client_user_message_id)) == 1
                assert set(model_copies(scripted_model, steer.id)) == {1}
                assert [m["params"]["expectedTurnId"] for m in s.sent("turn/steer")] == [turn]
