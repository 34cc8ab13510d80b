"""The daemon's connection task: what the server sent meanwhile reaches the brain in
one list, not one list per message (a round per message could never catch up); and a
thread that started before the daemon attached reaches it whole, with its running turn."""

from __future__ import annotations

import contextlib
import math

import anyio
import pytest

import tillerman.controller.daemon.daemon as daemon_module
from tillerman.controller.daemon.daemon import BATCH, Daemon, DaemonOptions
from tillerman.ledger.events import ThreadStarted, TurnCompleted, TurnStarted
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.jsonrpc import Notification, RpcError
from tillerman.rules.files import default_ruleset


def _turn_started(n: int) -> Notification:
    params = {"threadId": "T1", "turn": {"id": f"turn-{n}", "status": "inProgress", "items": []}}
    return Notification(method="turn/started", params=params,
                        raw={"method": "turn/started", "params": params, "emittedAtMs": 1000})


class _Server:
    """A connection whose server has already sent ``backlog`` notifications."""

    def __init__(self, backlog: int) -> None:
        send, self.incoming = anyio.create_memory_object_stream(math.inf)
        for n in range(backlog):
            send.send_nowait(_turn_started(n))
        self.keep_open = send
        self.initialize_result = {"userAgent": "fake/0.163.0 (x)"}

    async def request(self, method, params=None, timeout=10.0):
        return {"data": []}


def _inbox(monkeypatch, server, enough) -> list[list]:
    """The lists of envelopes the brain's inbox received from the daemon's connection to
    ``server`` (the empty "look at the ledger" wake-ups left out), until ``enough`` of them."""

    @contextlib.asynccontextmanager
    async def open_app_server(url, **kwargs):
        yield server

    received: list[list] = []

    async def run():
        with SQLiteRecorder(":memory:") as recorder:
            daemon = Daemon(recorder, default_ruleset(), DaemonOptions(url="unix:///fake.sock"))
            async with anyio.create_task_group() as tg:
                tg.start_soon(daemon._connection, tg)
                with anyio.fail_after(10):
                    while not enough(received):
                        if envelopes := await daemon._inbox.receive():
                            received.append(envelopes)
                tg.cancel_scope.cancel()

    monkeypatch.setattr(daemon_module, "open_app_server", open_app_server)
    anyio.run(run)
    return received


def _sends(monkeypatch, backlog: int) -> list[int]:
    """The sizes of the lists the brain received, until the backlog is through."""
    lists = _inbox(monkeypatch, _Server(backlog), lambda got: sum(map(len, got)) >= backlog)
    return [len(envelopes) for envelopes in lists]


def test_a_backlog_reaches_the_brain_in_one_list(monkeypatch):
    assert _sends(monkeypatch, 300) == [300]


def test_a_backlog_longer_than_a_batch_is_cut_at_the_batch(monkeypatch):
    assert _sends(monkeypatch, BATCH + 10) == [BATCH, 10]


class _LateServer:
    """A server the daemon attaches to after thread T1 started: a turn runs in it.
    ``ephemeral``: T1 is Codex's own housekeeping; ``refuse_resume``: it cannot be
    subscribed to yet; ``status``: T1's loaded status; ``listed``: how the resume's first
    page lists the running turn."""

    def __init__(self, *, ephemeral: bool = False, refuse_resume: bool = False, status: str = "active",
                 listed: dict | None = None) -> None:
        self.keep_open, self.incoming = anyio.create_memory_object_stream(math.inf)
        self.initialize_result = {"userAgent": "fake/0.163.0 (x)"}
        self.ephemeral, self.refuse_resume, self.status = ephemeral, refuse_resume, status
        self.methods: list[str] = []
        self.listed = listed or {"status": "inProgress"}

    async def request(self, method, params=None, timeout=10.0):
        self.methods.append(method)
        if method == "thread/loaded/list":
            return {"data": ["T1"]}
        if method == "thread/read":
            return {"thread": {"id": "T1", "cwd": "/w", "ephemeral": self.ephemeral,
                               "status": {"type": self.status, "activeFlags": []}}}
        if method == "thread/resume":
            assert not self.ephemeral, "housekeeping is never subscribed to"
            if self.refuse_resume:
                raise RpcError(-32600, "no rollout found for thread id T1")
            await anyio.sleep(0.2)  # the brain would judge the read's answer meanwhile
            return {"thread": {"id": "T1"},
                    "initialTurnsPage": {"data": [{"id": "turn-1", "items": [], **self.listed}]}}
        return {"data": []}


def test_a_thread_read_late_reaches_the_brain_with_its_running_turn(monkeypatch):
    """Sent alone, the read's ``thread_started`` let the brain dispatch a queued message
    to a thread it took for idle, waiting behind no turn (so no readback could settle it)."""
    (first,) = _inbox(monkeypatch, _LateServer(), bool)  # the first list the brain gets of T1
    assert [type(e.event) for e in first][:2] == [ThreadStarted, TurnStarted]  # with its running turn


def test_a_resumed_threads_turn_listed_as_just_starting_is_not_recorded_ended(monkeypatch):
    """Codex 0.171 lists a turn that is just starting as interrupted with no end time; the
    resume goes only to a thread that runs a turn, so that turn is running, not over."""
    server = _LateServer(listed={"status": "interrupted", "completedAt": None})
    (first,) = _inbox(monkeypatch, server, bool)
    assert not [e for e in first if isinstance(e.event, TurnCompleted)]


@pytest.mark.parametrize("server", [_LateServer(ephemeral=True), _LateServer(refuse_resume=True)],
                         ids=["housekeeping", "resume-refused"])
def test_a_thread_read_late_is_recorded_when_no_resume_follows(monkeypatch, server):
    (first,) = _inbox(monkeypatch, server, bool)
    assert [(type(e.event), e.event.thread_id) for e in first] == [(ThreadStarted, "T1")]


def test_an_idle_thread_is_read_not_resumed_until_its_next_turn(monkeypatch):
    """A resume of an idle thread makes Codex continue its active goal (a turn starts):
    attaching reads it and lists its latest turn, and subscribes only once it runs."""
    server = _LateServer(status="idle")
    methods_when_read: list[str] = []

    def a_person_starts_a_turn_then_it_is_subscribed(got: list[list]) -> bool:
        if len(got) == 1 and not methods_when_read:
            methods_when_read.extend(server.methods)
            server.status = "active"  # the broadcast status, which every connection gets
            params = {"threadId": "T1", "status": {"type": "active", "activeFlags": []}}
            server.keep_open.send_nowait(Notification(method="thread/status/changed", params=params, raw={
                "method": "thread/status/changed", "params": params, "emittedAtMs": 1000}))
        return any(TurnStarted in {type(e.event) for e in envelopes} for envelopes in got)

    first, *_ = _inbox(monkeypatch, server, a_person_starts_a_turn_then_it_is_subscribed)
    assert {(type(e.event), e.event.thread_id) for e in first} == {(ThreadStarted, "T1")}  # no turn runs
    assert "thread/resume" not in methods_when_read
    assert methods_when_read[-3:] == ["thread/read", "thread/turns/list", "thread/goal/get"]
    assert server.methods.count("thread/resume") == 1
