"""Claude Code hook payloads, one JSON object a line (what a hook command reads on
stdin; a file holding one payload is a file of one line). Payloads carry no times.

Threads: the session (``session_id``). Turns: ``UserPromptSubmit`` opens one, whose id is
the payload's ``prompt_id``; a ``UserPromptSubmit`` with the running turn's
``prompt_id`` is a message folded into that turn (a user message, no new turn).
``Stop`` ends the turn ``completed``, ``StopFailure`` ``failed`` (with an error);
``SessionEnd`` ends the session (``status_changed`` to ``SESSION_ENDED``).
An interrupted turn fires neither, so a prompt with a new ``prompt_id`` while a turn is
open ends that one ``interrupted``, as ``SessionEnd`` does.

Tools: ``PreToolUse`` starts a call (``tool_use_id``); ``PostToolUse`` ends it
``completed`` (``interrupted`` when ``tool_response.interrupted``),
``PostToolUseFailure`` ``failed``. ``PermissionRequest`` names no call: it is an
``approval_requested`` for the open call of the turn with the same tool input, and the
call's end resolves it. A call still open when its turn ends never finished: at a
``Stop`` (the turn went on without it) or when it asked for approval, it was refused
(``declined``: a denied call fires no PostToolUse, and its PermissionRequest hook may
even run after the Stop); when the turn was cut short, it was stopped while running
(``interrupted``). Hooks do not see the queue.

``Notification``, ``PreCompact``, ``SubagentStart``, ``SubagentStop`` and
``SessionStart`` after the first are read quietly; other events count as unknown.

tillerman's own deliveries (``tillerman.controller.claude_hook``) are kept on the line of
the hook that made them, under ``tillerman``: ``{"delivered": <intent id>, "text": ...}``
at a ``Stop`` (it blocked: the turn goes on, so it does not end there) or a
``PreToolUse`` (it denied the call, which ends ``declined`` at once). The hook's exit
proves nothing; what the CLI does next does, and a delivered message proven is read as
a user message with our ``client_id`` in that turn, which acknowledges the intent.

After a ``Stop`` block, the turn's next hook event — a ``Stop`` with
``stop_hook_active``, a ``PreToolUse`` or a ``PostToolUse`` with the same
``prompt_id`` — comes only after the model was called again with our text (no call is
running at a Stop). A deny is proven only by the turn's next ``Stop``: the denied
call's result goes to the model together with the results of every other call of the
same model message (parallel calls), and those calls' ``PreToolUse`` and
``PostToolUse`` hooks may come after our deny (Claude Code 2.1.332 runs a message's
calls one after another, or at once when they are read-only, and fires each call's
hooks as it goes), while the hooks name no message: a tool hook after a deny may be
the same message's, so only the model's final answer shows it read our text. A
``PostToolUse`` or ``PostToolUseFailure`` of the very call our hook denied shows the
call ran, so the deny was not honoured and the model got the call's output, not our
text: that is a ``DenyNotHonoured`` (the delivery expires, never acknowledged), never
an echo. A turn that ends otherwise (a new prompt, ``StopFailure``, ``SessionEnd``)
leaves it unproven. ``{"fail_open": <why>}`` records a hook that answered nothing.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

from tillerman.ledger.events import (
    SESSION_ENDED,
    ApprovalRequested,
    ApprovalResolved,
    DenyNotHonoured,
    Error,
    Event,
    ItemCompleted,
    StatusChanged,
    ThreadStarted,
    TurnCompleted,
    TurnStarted,
    TurnStatus,
)
from tillerman.monitor.digest import digest
from tillerman.monitor.parser import Call, OpenCalls, Parser, command_text, obj, text, workdir

_QUIET_EVENTS = frozenset({"Notification", "PreCompact", "SubagentStart", "SubagentStop", "SessionStart"})
_SHELL_TOOLS = frozenset({"Bash", "BashOutput", "PowerShell"})


class _Delivered(NamedTuple):
    """What one of our hooks answered with, not yet proven to have reached the model."""

    intent_id: str
    text: str
    denied: str | None  # the call our PreToolUse hook denied to deliver it; None: a Stop block


class _Session:
    __slots__ = ("turn", "calls", "inputs", "asked", "delivered", "stopped")

    def __init__(self) -> None:
        self.turn: str | None = None
        self.delivered: list[_Delivered] = []  # a deny per parallel call, then at most one Stop block
        self.stopped = False  # the turn reached a Stop our hook blocked: it completed, then went on
        self.calls = OpenCalls()
        self.inputs: dict[str, str] = {}  # open call id → digest of its tool input
        self.asked: set[str] = set()  # open calls that asked for approval


class ClaudeHooksParser(Parser):
    format = "claude-hooks"
    untimed: ClassVar[bool] = True

    def __init__(self, source: str, **options: Any) -> None:
        super().__init__(source, **options)
        self._sessions: dict[str, _Session] = {}

    def _events(self, record: dict) -> list[Event]:
        name = text(record, "hook_event_name")
        session_id = text(record, "session_id") or ""
        events: list[Event] = []
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session()
            events.append(ThreadStarted(thread_id=session_id, source_format=self.format,
                                        **workdir(text(record, "cwd"), retain=self.retain_payloads)))
        events += self._continued(record, name, session_id, session)
        reader = _READERS.get(name or "")
        if reader is None:
            if name not in _QUIET_EVENTS:
                self.unknown_types[str(name)] += 1
            return events
        return events + reader(self, record, session_id, session)

    # -- tillerman's deliveries ---------------------------------------------------------

    def _continued(self, record: dict, name: str | None, thread_id: str, session: _Session) -> list[Event]:
        """Our delivered texts that this hook event of their turn proves reached the model
        (a denied call that ran: proof it did not)."""
        if not session.delivered or name not in _CONTINUATIONS:
            return []
        if (text(record, "prompt_id") or session.turn) != session.turn:
            return []
        if name == "Stop" and session.stopped and record.get("stop_hook_active") is not True:
            return []  # a Stop our hook blocked is followed by one that says so
        events: list[Event] = []
        for delivered in list(session.delivered):
            event = self._proof(delivered, record, name, thread_id, session.turn)
            if event is not None:
                session.delivered.remove(delivered)
                events.append(event)
        session.stopped = session.stopped and any(d.denied is None for d in session.delivered)
        return events

    def _proof(self, delivered: _Delivered, record: dict, name: str, thread_id: str,
               turn_id: str | None) -> Event | None:
        client_id = f"tillerman-{delivered.intent_id}"
        if delivered.denied is None or name == "Stop":
            return self._user_message(delivered.text, thread_id=thread_id, turn_id=turn_id, client_id=client_id,
                                      item_id=f"hook:{delivered.intent_id}")
        if name in _TOOL_ENDS and text(record, "tool_use_id") == delivered.denied:
            status = "failed" if name == "PostToolUseFailure" else "completed"
            return DenyNotHonoured(item_id=delivered.denied, client_id=client_id, status=status, thread_id=thread_id,
                                   turn_id=turn_id)
        return None  # a call of the denied call's own model message, maybe: no proof

    # -- turns -------------------------------------------------------------------

    def _prompt(self, record: dict, thread_id: str, session: _Session) -> list[Event]:
        prompt_id = text(record, "prompt_id") or f"line@{self._offset}"
        events: list[Event] = []
        if prompt_id != session.turn:
            events += self._end(thread_id, session, "interrupted")  # no Stop: it was interrupted
            session.turn = prompt_id
            events.append(TurnStarted(thread_id=thread_id, turn_id=prompt_id))
        prompt = record.get("prompt")
        events.append(self._user_message(prompt if isinstance(prompt, str) else repr(prompt), thread_id=thread_id,
                                         turn_id=session.turn))
        return events

    def _stop(self, record: dict, thread_id: str, session: _Session) -> list[Event]:
        delivered = _delivered(record)
        if delivered is not None and session.turn is not None:
            session.delivered.append(_Delivered(*delivered, denied=None))
            session.stopped = True  # blocked: the turn goes on
            return []
        return self._end(thread_id, session, "completed")

    def _stop_failure(self, record: dict, thread_id: str, session: _Session) -> list[Event]:
        message = record.get("last_assistant_message", record.get("error"))
        error = Error(message_digest=digest(message if message is not None else ""), thread_id=thread_id,
                      turn_id=session.turn)
        return [error, *self._end(thread_id, session, "failed")]

    def _session_end(self, record: dict, thread_id: str, session: _Session) -> list[Event]:
        """The session ended (the CLI exits): a turn still open was cut short, and the
        thread's status is ``SESSION_ENDED`` until a resumed session runs a turn in it."""
        return [*self._end(thread_id, session, "interrupted"), StatusChanged(thread_id=thread_id, status=SESSION_ENDED)]

    def _end(self, thread_id: str, session: _Session, status: TurnStatus) -> list[Event]:
        if session.turn is None:
            return []
        if session.stopped and status == "interrupted":
            status = "completed"  # it had stopped (our block was not taken up), not been cut short
        session.delivered, session.stopped = [], False
        events: list[Event] = []
        for tool_use_id, call in session.calls.abandon():
            refused = status != "interrupted" or tool_use_id in session.asked
            events.append(ItemCompleted(item_id=tool_use_id, item_type=call.item_type,
                                        status="declined" if refused else "interrupted", tool=call.tool,
                                        critical=call.critical, external=call.external, thread_id=thread_id,
                                        turn_id=call.turn_id))
        session.inputs.clear()
        session.asked.clear()
        events.append(TurnCompleted(thread_id=thread_id, turn_id=session.turn, status=status))
        session.turn = None
        return events

    # -- tools -------------------------------------------------------------------

    def _pre_tool(self, record: dict, thread_id: str, session: _Session) -> list[Event]:
        name = text(record, "tool_name")
        tool_input = obj(record, "tool_input")
        item_type = "commandExecution" if name in _SHELL_TOOLS else "toolCall"
        command = command_text(tool_input.get("command")) if item_type == "commandExecution" else None
        started = self._item_started(text(record, "tool_use_id") or f"tool@{self._offset}", item_type,
                                     command=command, args=tool_input, tool=name, thread_id=thread_id,
                                     turn_id=session.turn)
        if not session.calls.start(started.item_id, Call(session.turn, item_type, name, started.critical,
                                                         started.external)):
            return []
        session.inputs[started.item_id] = digest(tool_input)
        delivered = _delivered(record)
        if delivered is None:
            return [started]
        session.delivered.append(_Delivered(*delivered, denied=started.item_id))  # denied: it should not run
        session.calls.finish(started.item_id, authoritative=True)
        session.inputs.pop(started.item_id, None)
        return [started, ItemCompleted(item_id=started.item_id, item_type=item_type, status="declined", tool=name,
                                       critical=started.critical, external=started.external, thread_id=thread_id,
                                       turn_id=session.turn)]

    def _permission(self, record: dict, thread_id: str, session: _Session) -> list[Event]:
        wanted = digest(obj(record, "tool_input"))
        call = next((i for i, d in reversed(session.inputs.items()) if d == wanted and i not in session.asked), None)
        if call is None:
            return []  # its call has ended already (hooks run concurrently): nothing is pending
        session.asked.add(call)
        return [ApprovalRequested(item_id=call, thread_id=thread_id, turn_id=session.turn)]

    def _post_tool(self, record: dict, thread_id: str, session: _Session) -> list[Event]:
        response = record.get("tool_response")
        interrupted = isinstance(response, dict) and response.get("interrupted") is True
        failed = text(record, "hook_event_name") == "PostToolUseFailure"
        return self._tool_end(record, thread_id, session,
                              "interrupted" if interrupted else "failed" if failed else "completed", response)

    def _tool_end(self, record: dict, thread_id: str, session: _Session, status: str, output: Any) -> list[Event]:
        tool_use_id = text(record, "tool_use_id") or f"tool@{self._offset}"
        call = session.calls.finish(tool_use_id, authoritative=True)
        if call is False:
            return []
        started = call if isinstance(call, Call) else None
        turn_id = started.turn_id if started else session.turn
        session.inputs.pop(tool_use_id, None)
        events: list[Event] = []
        if tool_use_id in session.asked:
            session.asked.discard(tool_use_id)
            events.append(ApprovalResolved(item_id=tool_use_id, decision="accept", thread_id=thread_id,
                                           turn_id=turn_id))
        events.append(self._item_completed(
            tool_use_id, started.item_type if started else "toolCall", output=output, status=status,
            tool=started.tool if started else text(record, "tool_name"),
            flags=(started.critical, started.external) if started else None, thread_id=thread_id, turn_id=turn_id))
        return events


def _delivered(record: dict) -> tuple[str, str] | None:
    """The intent our hook delivered on this line, and its text."""
    answer = record.get("tillerman")
    if not isinstance(answer, dict) or not isinstance(answer.get("delivered"), str):
        return None
    said = answer.get("text")
    return answer["delivered"], said if isinstance(said, str) else ""


_TOOL_ENDS = frozenset({"PostToolUse", "PostToolUseFailure"})
_CONTINUATIONS = frozenset({"Stop", "PreToolUse", *_TOOL_ENDS})
_READERS = {
    "UserPromptSubmit": ClaudeHooksParser._prompt,
    "Stop": ClaudeHooksParser._stop,
    "StopFailure": ClaudeHooksParser._stop_failure,
    "SessionEnd": ClaudeHooksParser._session_end,
    "PreToolUse": ClaudeHooksParser._pre_tool,
    "PermissionRequest": ClaudeHooksParser._permission,
    "PostToolUse": ClaudeHooksParser._post_tool,
    "PostToolUseFailure": ClaudeHooksParser._post_tool,
}
