"""Codex TUI session recordings (``CODEX_TUI_RECORD_SESSION=1``).

Each line is ``{"ts", "dir": meta|to_tui|from_tui, "kind", …}``. ``codex_event``
lines carry the core protocol event as ``payload{id, msg{type, …}}``, where
``payload.id`` is the submission that the event belongs to (the turn, in the
protocol versions that have no ``turn_id``). ``op`` lines are what the TUI sent:
``exec_approval``/``patch_approval`` answer an approval wait, sometimes minutes
after the request. Their ``id`` is the call id in current versions and the
event (submission) id in older ones, so pending approvals are found by either.
Screen bookkeeping (redraws, key presses, log lines) carries no session facts.
"""

from __future__ import annotations

from tillerman.ledger.events import (
    ApprovalRequested,
    ApprovalResolved,
    Error,
    Event,
    ThreadStarted,
    TurnCompleted,
    TurnStarted,
)
from tillerman.monitor.digest import digest
from tillerman.monitor.parser import Call, OpenCalls, Parser, command_text, integer, iso_time, obj, text

_QUIET_KINDS = frozenset({"app_event", "key_event", "log_line", "insert_history", "session_start",
                          "session_end", "paste_event", "resize_event"})
_QUIET_EVENTS = frozenset({
    "token_count", "agent_message_delta", "agent_reasoning", "agent_reasoning_delta",
    "agent_reasoning_raw_content", "agent_reasoning_raw_content_delta", "agent_reasoning_section_break",
    "exec_command_output_delta", "background_event", "turn_diff", "plan_update", "get_history_entry_response",
    "mcp_list_tools_response", "list_custom_prompts_response", "shutdown_complete", "web_search_begin",
    "web_search_end", "conversation_path", "entered_review_mode", "exited_review_mode", "user_message_delta",
    "mcp_startup_update", "mcp_startup_complete", "stream_info", "deprecation_notice", "warning",
})
_APPROVAL_REQUESTS = {"exec_approval_request": "command", "apply_patch_approval_request": "fileChange"}
_APPROVAL_OPS = frozenset({"exec_approval", "patch_approval"})
_BEGIN = {"exec_command_begin": "commandExecution", "patch_apply_begin": "fileChange",
          "mcp_tool_call_begin": "mcpToolCall"}
_END = {"exec_command_end": "commandExecution", "patch_apply_end": "fileChange",
        "mcp_tool_call_end": "mcpToolCall"}


class CodexTuiParser(Parser):
    format = "codex-tui"

    def __init__(self, source: str, **options) -> None:
        super().__init__(source, **options)
        self._thread: str | None = None
        self._turn: str | None = None
        self._calls = OpenCalls()
        # Pending approval waits: call id → (turn, event id).
        self._approvals: dict[str, tuple[str | None, str | None]] = {}

    def _time(self, record: dict) -> float | None:
        return iso_time(record.get("ts"))

    def _ids(self, turn: str | None = None) -> dict:
        return {"thread_id": self._thread, "turn_id": turn or self._turn}

    def _events(self, record: dict) -> list[Event]:
        kind = text(record, "kind")
        if kind == "codex_event":
            body = obj(record, "payload")
            return self._codex_event(text(body, "id"), obj(body, "msg"))
        if kind == "op":
            return self._op(obj(record, "payload"))
        if kind not in _QUIET_KINDS:
            self.unknown_types[str(kind)] += 1
        return []

    def _codex_event(self, event_id: str | None, msg: dict) -> list[Event]:
        kind = text(msg, "type")
        if kind == "session_configured":
            self._thread = text(msg, "session_id") or self._thread
            return [ThreadStarted(thread_id=self._thread, source_format=self.format)]
        if kind == "task_started":
            self._turn = text(msg, "turn_id") or event_id or f"turn@{self._offset}"
            return [TurnStarted(**self._ids())]
        if kind in ("task_complete", "turn_aborted"):
            turn = text(msg, "turn_id") or self._turn or event_id
            self._turn = None
            status = "completed" if kind == "task_complete" else "interrupted"
            return [TurnCompleted(status=status, duration_ms=integer(msg, "duration_ms"), **self._ids(turn))]
        if kind == "user_message":
            return [self._user_message(text(msg, "message") or "", **self._ids())]
        if kind == "agent_message":
            return [self._agent_message(text(msg, "message") or "", **self._ids())]
        if kind in _APPROVAL_REQUESTS:
            call_id = text(msg, "call_id") or event_id or f"call@{self._offset}"
            self._approvals[call_id] = (self._turn, event_id)
            return [ApprovalRequested(item_id=call_id, approval_kind=_APPROVAL_REQUESTS[kind], **self._ids())]
        if kind in _BEGIN:
            call_id = text(msg, "call_id") or f"call@{self._offset}"
            command = command_text(msg.get("command"))
            started = self._item_started(call_id, _BEGIN[kind], command=command, args=msg.get("command"),
                                         **self._ids())
            self._calls.start(call_id, Call(self._turn, _BEGIN[kind], None, started.critical, started.external))
            return [started]
        if kind in _END:
            return self._end(text(msg, "call_id") or f"call@{self._offset}", _END[kind], msg)
        if kind in ("error", "stream_error"):
            return [Error(message_digest=digest(text(msg, "message") or ""), **self._ids())]
        if kind not in _QUIET_EVENTS:
            self.unknown_types[f"codex_event:{kind}"] += 1
        return []

    def _end(self, call_id: str, item_type: str, msg: dict) -> list[Event]:
        call = self._calls.finish(call_id, authoritative=True)
        if call is False:
            return []
        exit_code = integer(msg, "exit_code")
        failed = (exit_code not in (None, 0)) or msg.get("success") is False
        output = text(msg, "aggregated_output") or text(msg, "stdout")
        return [self._item_completed(
            call_id, item_type, output=output, status="failed" if failed else "completed", exit_code=exit_code,
            flags=(call.critical, call.external) if call else None, **self._ids(call.turn_id if call else None),
        )]

    def _op(self, op: dict) -> list[Event]:
        kind = text(op, "type")
        if kind not in _APPROVAL_OPS:
            return []  # user input, interrupts …: their effects show up as codex events
        answered = text(op, "id")
        call_id = answered if answered in self._approvals else next(
            (call for call, (_, event_id) in self._approvals.items() if event_id == answered), None)
        if call_id is None:
            return []  # an answer to a request this recording does not show
        turn, _ = self._approvals.pop(call_id)
        return [ApprovalResolved(item_id=call_id, decision=_decision(op.get("decision")), **self._ids(turn))]


def _decision(value) -> str | None:
    """``"approved"``, or the variant name of a structured decision (``{"approved_execpolicy_amendment": …}``)."""
    if isinstance(value, dict) and len(value) == 1:
        return next(iter(value))
    return value if isinstance(value, str) else None
