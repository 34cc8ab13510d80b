"""Helpers for running the whole daemon in-process beside a harness on the REAL app-server.

``Session`` holds the harness connection (it answers approvals, like an IDE would) and,
once ``start_daemon`` is called, a ``tillerman.controller.daemon.daemon.Daemon`` with its own SQLite
ledger and a ``--trace`` file, so a test can see every request the daemon sent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio

from fixtures.codex_server import (
    AppServer,
    EventLog,
    HarnessClient,
    is_notification,
    start_thread,
    start_turn,
    watched_connection,
)
from fixtures.rule_texts import grant
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger import projections
from tillerman.ledger.events import Entry
from tillerman.ledger.projections import IntentView, Projection
from tillerman.ledger.recorder import Recorder
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.config import load_effective
from tillerman.rules.ruleset import RuleSet

T = TypeVar("T")
#: The owner the live tests propose as, and a config granting them every dispatch mode.
OWNER = "ann"
OWNER_GRANT = grant(f"owner:{OWNER}", ["steer", "queue", "interrupt"], threads="*")
SETTLED = frozenset({"acknowledged", "effect_verified", "effect_failed", "expired", "rejected"})


def ruleset_from(tmp_path: Path, rules: str, grants: str) -> RuleSet:
    """A rule set loaded from TOML files, as ``tillerman run --rules --config`` would."""
    rules_path, config_path = tmp_path / "rules.toml", tmp_path / "config.toml"
    rules_path.write_text(rules)
    config_path.write_text(grants)
    return load_effective(rules_path, config_path).ruleset


async def wait_until(predicate: Callable[[], T], what: str, timeout: float = 20.0, interval: float = 0.02) -> T:
    try:
        with anyio.fail_after(timeout):
            while not (value := predicate()):
                await anyio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None
    return value


class Session:
    def __init__(self, server: AppServer, harness: HarnessClient, log: EventLog, tmp_path: Path,
                 recorder: Recorder | None = None):
        self.server = server
        self.harness = harness
        self.log = log
        self.tmp_path = tmp_path
        self.ledger = recorder or SQLiteRecorder(tmp_path / "ledger.sqlite3")
        self.trace_path = tmp_path / "daemon-trace.jsonl"
        self.daemon: Daemon | None = None
        self._tg: Any = None

    @property
    def recorder(self) -> Recorder:
        """The ledger as this process's writers reach it: through the running daemon's gate
        (a round's commit may be out on its thread), or directly when none runs."""
        return self.daemon.recorder if self.daemon is not None else self.ledger

    # -- the daemon -------------------------------------------------------------------

    async def start_daemon(self, ruleset: RuleSet, **options: Any) -> Daemon:
        options = {"url": self.server.url, "trace": str(self.trace_path), "request_timeout": 5.0, **options}
        self.daemon = Daemon(self.ledger, ruleset, DaemonOptions(**options))
        await self._tg.start(self.daemon.run)
        await self.daemon.connected.wait()  # attached and read back: deliveries may go
        return self.daemon

    def projection(self) -> Projection:
        return projections.load(self.recorder)

    def intent(self, intent_id: str) -> IntentView:
        return self.projection().intents[intent_id]

    def entries(self) -> list[Entry]:
        return list(self.recorder.read())

    def events(self, kind: type) -> list:
        return [e.envelope.event for e in self.entries() if isinstance(e.envelope.event, kind)]

    async def wait_state(self, intent_id: str, states: frozenset[str] | set[str], timeout: float = 20.0) -> IntentView:
        return await wait_until(lambda: (v := self.intent(intent_id)).state in states and v,
                                f"intent {intent_id} to reach one of {sorted(states)}", timeout, interval=0.01)

    def traced(self, direction: str) -> list[dict]:
        """Every message the daemon sent (``"out"``) or received (``"in"``), from its trace."""
        if not self.trace_path.exists():
            return []
        records = (json.loads(line) for line in self.trace_path.read_text().splitlines())
        return [r["msg"] for r in records if r.get("dir") == direction and isinstance(r.get("msg"), dict)]

    def sent(self, method: str | None = None) -> list[dict]:
        """Every request the daemon sent (from its trace), optionally of one method."""
        return [m for m in self.traced("out") if "method" in m and (method is None or m["method"] == method)]

    # -- the harness ------------------------------------------------------------------

    async def start_thread(self, workspace: Path, **params: Any) -> str:
        return await start_thread(self.harness, workspace, **params)

    async def start_turn(self, thread_id: str, prompt: str) -> str:
        return await start_turn(self.harness, thread_id, prompt)

    async def start_command(self, workspace: Path, prompt: str) -> tuple[str, str]:
        """A new thread whose first turn runs a command (``prompt`` is ``RUN: ...``): its thread
        and turn ids, once the daemon's ledger shows the command running."""
        thread = await self.start_thread(workspace)
        turn = await self.start_turn(thread, prompt)
        await wait_until(lambda: self.sees_command_started(thread, turn), "the daemon to see the command")
        return thread, turn

    async def turn_completed(self, thread_id: str, turn_id: str, timeout: float = 20.0) -> str:
        """The final status of the turn, as the harness saw it."""
        message = await self.log.wait_for(
            lambda m: is_notification("turn/completed", threadId=thread_id)(m) and m.params["turn"]["id"] == turn_id,
            timeout=timeout)
        return message.params["turn"]["status"]

    def user_messages(self, thread_id: str | None = None) -> list[dict]:
        """``item/completed`` userMessage params the harness saw (turnId, item)."""
        return [m.params for m in self.log.messages
                if is_notification("item/completed")(m) and m.params["item"].get("type") == "userMessage"
                and (thread_id is None or m.params.get("threadId") == thread_id)]

    def sees_command_started(self, thread_id: str, turn_id: str) -> bool:
        """The daemon's ledger records the turn's command running (it is subscribed)."""
        return any(getattr(e, "item_type", None) == "commandExecution" and e.turn_id == turn_id
                   and e.thread_id == thread_id and type(e).__name__ == "ItemStarted"
                   for e in (x.envelope.event for x in self.entries()))


@asynccontextmanager
async def daemon_first(server: AppServer, tmp_path: Path, ruleset: RuleSet, **options: Any) -> AsyncIterator[Session]:
    """The daemon connects (and initializes) before anyone else, as when it already runs
    when a person opens the Codex TUI; then a client that only reads and watches (the
    session's ``harness``; it answers nothing unless a test makes it)."""
    async with anyio.create_task_group() as tg:
        s = Session(server, None, EventLog(), tmp_path)  # the observer connects below
        s._tg = tg
        try:
            await s.start_daemon(ruleset, **options)
            async with watched_connection(options.get("url", server.url), client_name="observer",
                                          client_class=HarnessClient) as (observer, log):
                s.harness, s.log = observer, log
                yield s
        finally:
            tg.cancel_scope.cancel()
    s.ledger.close()


@asynccontextmanager
async def session(server: AppServer, tmp_path: Path, recorder: Recorder | None = None) -> AsyncIterator[Session]:
    """The harness connects (and initializes) first; the daemon is started by the test.
    ``recorder``: the daemon's ledger (a SQLite file in ``tmp_path`` when none is given)."""
    async with watched_connection(server.url, client_name="harness", client_class=HarnessClient) as (harness, log), \
            anyio.create_task_group() as tg:
        s = Session(server, harness, log, tmp_path, recorder)
        s._tg = tg
        try:
            yield s
        finally:
            tg.cancel_scope.cancel()
    s.ledger.close()


def reached_model(model, text: str) -> int:
    """Model requests whose input holds ``text`` anywhere (any role, any position)."""
    return sum(1 for r in model.requests if text in json.dumps(r.body))
