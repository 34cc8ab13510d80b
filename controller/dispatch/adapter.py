"""The guarded adapter: the only code that sends an intervention to the app-server.

The delivery machine (``tillerman.controller.core.delivery``) decides what to send, and the
driver (``tillerman.controller.dispatch.driver``) hands this module each command; before every
send it checks AGAIN, at the boundary, against the ledger rather than anyone's memory:
it reads the intent's durable record back from the recorder and its thread's snapshot,
and ``tillerman.controller.core.boundary.judge`` says whether the command may go (the
checks are listed there). A forced interrupt through a critical tool is recorded,
fsynced, before the send.

The ``verify`` readback runs here too, in the thread's working directory as the server
(``thread/read``) or the ledger (the session file's ``cwd``) names it now; when neither
can, nothing runs and the machine fails the check (``cwd_unknown``).

A failed check raises the verdict's ``BoundaryRefusal`` and sends nothing. Every request
runs under a timeout; its outcome comes back as a delivery fact (``Replied``,
``Refused`` for a recognized refusal, ``NoAnswer`` for a timeout, a dropped
connection or an unrecognized error — see ``tillerman.controller.core.rpc_errors``).

The wire format — requests, and replies read into the typed values the machine takes —
is ``tillerman.monitor.codex_wire``'s (the real app-server 0.163.0).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any, Protocol

import anyio

from tillerman.controller.core.boundary import judge
from tillerman.controller.core.commands import (
    Command,
    Interrupt,
    ListTerminals,
    PauseGoal,
    QueueAdd,
    QueueDelete,
    QueueList,
    ReadBack,
    ReadGoal,
    ReadTurns,
    ResumeQueue,
    RunVerify,
    Steer,
    Terminate,
)
from tillerman.controller.core.delivery import READBACK_PAGE
from tillerman.controller.core.facts import Fact, NoAnswer, Refused, Replied, Verified
from tillerman.controller.dispatch.turn_listing import settled_listing
from tillerman.controller.core.intent_requests import intent_view
from tillerman.controller.core.rpc_errors import classify
from tillerman.ledger import projections
from tillerman.ledger.projections import IntentView
from tillerman.ledger.recorder import Recorder
from tillerman.ledger.snapshot import ThreadSnapshot
from tillerman.monitor import codex_wire as wire
from tillerman.monitor.appserver_client import AppServerDisconnected
from tillerman.monitor.digest import digest
from tillerman.monitor.jsonrpc import RpcError
from tillerman.rules.ruleset import RuleSet

DEFAULT_TIMEOUT = 10.0
DEFAULT_VERIFY_TIMEOUT = 60.0
#: Turns a stop reads to see whether one runs: the newest few (a turn that just started
#: is the newest).
STOP_TURNS_PAGE = 5


class AppServerLike(Protocol):
    async def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = ...) -> Any: ...


def request_for(command: Command) -> wire.Request:
    """The JSON-RPC method and params of an app-server command."""
    thread_id = command.thread_id
    match command:
        case Steer():
            return wire.steer(thread_id, command.expected_turn_id, command.client_user_message_id, command.text)
        case QueueAdd():
            return wire.queue_add(thread_id, command.client_user_message_id, command.text)
        case Interrupt():
            return wire.interrupt(thread_id, command.turn_id)
        case QueueList():
            return wire.queue_list(thread_id)
        case ReadBack():
            # newest first, with items: only the full view carries every userMessage and its clientId
            return wire.turns_list(thread_id, READBACK_PAGE, cursor=command.cursor, full_items=True)
        case ListTerminals():
            return wire.terminals_list(thread_id)
        case Terminate():
            return wire.terminate(thread_id, command.process_id)
        case ResumeQueue():
            return wire.queue_start(thread_id)
        case ReadGoal():
            return wire.goal_get(thread_id)
        case PauseGoal():
            return wire.goal_pause(thread_id, command.origin)
        case QueueDelete():
            return wire.queue_delete(thread_id, command.submission_id)
        case ReadTurns():
            # newest first; the summary view says whether a turn runs
            return wire.turns_list(thread_id, STOP_TURNS_PAGE)
    raise TypeError(f"{type(command).__name__} is not an app-server request")


#: How the reply to each command is read: the machine gets the typed value.
REPLY_PARSERS: dict[type[Command], Callable[[object], wire.Reply]] = {
    Steer: wire.parse_steer_accepted,
    QueueAdd: wire.parse_queued_submission,
    Interrupt: wire.parse_interrupt_accepted,
    QueueList: wire.parse_queue_page,
    ReadBack: wire.parse_turn_page,
    ListTerminals: wire.parse_terminal_list,
    Terminate: wire.parse_terminated,
    ResumeQueue: wire.parse_queue_started,
    ReadGoal: wire.parse_goal,
    PauseGoal: wire.parse_goal,
    QueueDelete: wire.parse_queue_deleted,
    ReadTurns: wire.parse_turn_page,
}


class GuardedAdapter:
    """Executes delivery commands over an app-server client, behind the boundary checks."""

    def __init__(
        self,
        client: AppServerLike,
        recorder: Recorder,
        ruleset: RuleSet,
        *,
        snapshot: Callable[[str], ThreadSnapshot] | None = None,
        recorded_cwd: Callable[[str], str | None] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        verify_timeout: float = DEFAULT_VERIFY_TIMEOUT,
        clock: Callable[[], float] = time.time,
        retain_payloads: bool = False,
    ) -> None:
        self.client = client
        self.recorder = recorder
        self.ruleset = ruleset  # the daemon swaps in a reloaded rule set
        # The daemon passes its live projection's views; the defaults re-fold the ledger.
        self.snapshot = snapshot or (lambda thread_id: projections.load(recorder).snapshot(thread_id))
        self.recorded_cwd = recorded_cwd or (lambda thread_id: projections.load(recorder).recorded_cwd(thread_id))
        self.timeout = timeout
        self.verify_timeout = verify_timeout
        self.clock = clock
        self.retain_payloads = retain_payloads  # the verify directory's path goes into evidence

    async def execute(self, command: Command) -> Fact:
        """Check, then send; raises a ``BoundaryRefusal`` (nothing sent) or returns the outcome.
        A read that names a ``not_before`` waits for it first, and is checked then."""
        if isinstance(command, ReadGoal | ReadTurns) and (wait := command.not_before - self.clock()) > 0:
            await anyio.sleep(wait)
        self.check(command)
        if isinstance(command, RunVerify):
            return await self._run_verify(command)
        method, params = request_for(command)
        try:
            if isinstance(command, ReadBack | ReadTurns):
                result = await settled_listing(lambda: self.client.request(method, params, timeout=self.timeout))
            else:
                result = await self.client.request(method, params, timeout=self.timeout)
        except RpcError as error:
            read = classify(error)
            if read.refusal is None:
                return NoAnswer(command, "unrecognized_error", self.clock(), read.evidence)
            return Refused(command, read.refusal, read.evidence, self.clock())
        except TimeoutError:
            return NoAnswer(command, "timeout", self.clock(), {"timeout": self.timeout})
        except AppServerDisconnected as lost:
            return NoAnswer(command, "disconnected", self.clock(), {"detail": str(lost)})
        reply = REPLY_PARSERS[type(command)](result)
        if isinstance(reply, wire.Listing) and not reply.readable:
            # A listing without its list proves nothing absent: the outcome stays unknown.
            return NoAnswer(command, "unreadable_reply", self.clock(), {"detail": "no data list in the reply"})
        return Replied(command, reply, self.clock())

    def check(self, command: Command) -> IntentView:
        """Every boundary check for one command, against the ledger's record of its intent
        read back now (a guard against a stale machine, not a cache miss)."""
        view = intent_view(self.recorder, command.intent_id)
        verdict = judge(command, view, self.snapshot(view.intent.thread_id), self.ruleset, self.clock())
        if verdict.refusal is not None:
            raise verdict.refusal
        if verdict.record:
            self.recorder.append(list(verdict.record), durable=True)
        return view

    async def _run_verify(self, command: RunVerify) -> Verified:
        """The intent's readback command, in a shell, in the thread's working directory
        (not the daemon's: ``test -f build/ok`` checks the agent's tree), under a timeout
        (killed when it expires). No directory, no run: the machine fails the check."""
        cwd = await self._thread_cwd(command.thread_id)
        if cwd is None:
            return Verified(None, self.clock(), cwd_digest=None)
        where = {"cwd_digest": digest(cwd), "cwd": cwd if self.retain_payloads else None}
        with anyio.move_on_after(self.verify_timeout):
            try:
                done = await anyio.run_process(["/bin/sh", "-c", command.command], cwd=cwd, check=False,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            except OSError as exc:  # the directory is gone, or no shell: no verdict
                return Verified(None, self.clock(), **where, error=f"{type(exc).__name__}: {exc.strerror or exc}")
            return Verified(done.returncode, self.clock(), **where)
        return Verified(None, self.clock(), **where, error="timeout")

    async def _thread_cwd(self, thread_id: str) -> str | None:
        """The thread's working directory now: the server's (``thread/read``), else the one
        its session file named, when the ledger kept it (``--retain-payloads``)."""
        try:
            cwd = wire.parse_thread_cwd(await self.client.request(*wire.thread_read(thread_id), timeout=self.timeout))
        except (RpcError, TimeoutError, AppServerDisconnected):
            cwd = None
        return cwd or self.recorded_cwd(thread_id)

