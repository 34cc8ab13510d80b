"""Codex rollout JSONL (``$CODEX_HOME/sessions/…/rollout-<ts>-<threadId>.jsonl``).

Each line is ``{"timestamp", "type", "payload"}`` (0.163 adds ``ordinal``).
Turns: current CLIs write ``task_started``/``task_complete``/``turn_aborted`` with
real turn ids. Old CLIs (0.40, 0.58) write none of these; there a turn runs from
one ``user_message`` to the next (or to ``turn_aborted``), and its id is made
from the byte offset of the user message that opened it, which is stable across
re-reads. Once a file shows ``task_started`` it is read the current way: a second
``user_message`` inside an open turn is then a steer, not a new turn.

Rollouts show no approvals and no queue. ``sandbox_permissions:
"require_escalated"`` in a call's arguments only says approval may have been
asked; without the answer it would open an approval wait that never closes, so
it is not turned into an event.
"""

from __future__ import annotations

import re
from collections import Counter

import msgspec

from tillerman.ledger.events import Error, Event, ThreadStarted, TurnCompleted, TurnStarted
from tillerman.monitor.digest import digest
from tillerman.monitor.lines import decode_json
from tillerman.monitor.parser import Call, OpenCalls, Parser, command_text, integer, iso_time, items, obj, text, workdir

_THREAD_FROM_PATH = re.compile(r"rollout-[0-9T:-]+-([0-9a-fA-F-]{36})\.jsonl")
_EXIT_CODE = re.compile(r"(?:Exit code|exited with code)[:\s]+(-?\d+)")

SHELL_TOOLS = frozenset({"shell", "exec_command", "container.exec", "shell_command", "local_shell"})

_QUIET_TYPES = frozenset({"turn_context", "compacted", "world_state", "token_usage_record",
                          "inter_agent_communication_metadata"})
_QUIET_EVENTS = frozenset({
    "token_count", "agent_reasoning", "agent_reasoning_raw_content", "agent_reasoning_section_break",
    "context_compacted", "thread_settings_applied", "entered_review_mode", "exited_review_mode",
    "thread_name_updated", "plan_update", "turn_diff", "background_event", "undo_started",
    "undo_completed", "view_image_tool_call", "web_search_begin", "web_search_end",
})
_QUIET_ITEMS = frozenset({"message", "reasoning", "ghost_snapshot", "compaction"})


class CodexRolloutParser(Parser):
    format = "codex-rollout"

    def __init__(self, source: str, **options) -> None:
        super().__init__(source, **options)
        found = _THREAD_FROM_PATH.search(source)
        self._thread: str | None = found.group(1) if found else None
        self._turn: str | None = None  # the open turn
        self._explicit_turns = False  # the file has task_started: real turn ids
        self._calls = OpenCalls()
        # Messages reported in the open turn, to recognise a second copy (``_first_report``).
        self._said: Counter[tuple[tuple[str, str], bool]] = Counter()

    def _time(self, record: dict) -> float | None:
        return iso_time(record.get("timestamp"))

    def _events(self, record: dict) -> list[Event]:
        kind = text(record, "type")
        body = obj(record, "payload")
        if kind == "session_meta":
            return self._session_meta(body)
        if kind == "event_msg":
            return self._event_msg(body)
        if kind == "response_item":
            return self._response_item(body)
        if kind not in _QUIET_TYPES:
            self.unknown_types[str(kind)] += 1
        return []

    def _ids(self) -> dict:
        return {"thread_id": self._thread, "turn_id": self._turn}

    # -- session and turns -------------------------------------------------------

    def _session_meta(self, body: dict) -> list[Event]:
        self._thread = text(body, "id") or self._thread
        parent = text(body, "forked_from_id") or text(body, "parent_thread_id")
        source = body.get("source")
        if isinstance(source, dict):  # subagents: {"subagent": {"thread_spawn": {"parent_thread_id"}}}
            spawn = obj(obj(source, "subagent"), "thread_spawn")
            parent = parent or text(spawn, "parent_thread_id")
        return [ThreadStarted(
            thread_id=self._thread, parent_thread_id=parent, originator=text(body, "originator"),
            cli_version=text(body, "cli_version"), source_format=self.format,
            **workdir(text(body, "cwd"), retain=self.retain_payloads),
        )]

    def _start_turn(self, turn_id: str) -> list[Event]:
        self._turn = turn_id
        self._said.clear()
        return [TurnStarted(**self._ids())]

    def _end_turn(self, turn_id: str | None, status: str, duration_ms: int | None = None) -> list[Event]:
        turn_id = turn_id or self._turn
        if turn_id is None:
            return []
        if turn_id == self._turn:
            self._turn = None
        return [TurnCompleted(thread_id=self._thread, turn_id=turn_id, status=status, duration_ms=duration_ms)]

    # -- event_msg -------------------------------------------------------------------

    def _event_msg(self, body: dict) -> list[Event]:
        kind = text(body, "type")
        if kind == "task_started":
            self._explicit_turns = True
            return self._start_turn(text(body, "turn_id") or f"turn@{self._offset}")
        if kind == "task_complete":
            return self._end_turn(text(body, "turn_id"), "completed", integer(body, "duration_ms"))
        if kind == "turn_aborted":
            return self._end_turn(text(body, "turn_id"), "interrupted", integer(body, "duration_ms"))
        if kind == "user_message":
            return self._user_input(text(body, "message") or "", client_id=None, item_id=None)
        if kind == "agent_message":
            return self._agent_output(text(body, "message") or "", item_id=None)
        if kind == "item_completed":
            return self._item_completed_msg(obj(body, "item"))
        if kind in ("exec_command_begin", "patch_apply_begin", "mcp_tool_call_begin"):
            return self._begin(body, kind)
        if kind in ("exec_command_end", "patch_apply_end", "mcp_tool_call_end"):
            return self._end(body, kind)
        if kind in ("error", "stream_error"):
            return [Error(message_digest=digest(text(body, "message") or ""), **self._ids())]
        if kind not in _QUIET_EVENTS:
            self.unknown_types[f"event_msg:{kind}"] += 1
        return []

    def _item_completed_msg(self, item: dict) -> list[Event]:
        """0.163 writes user input, agent output and commands as completed items."""
        item_type = text(item, "type")
        item_id = text(item, "id")
        if item_type in ("UserMessage", "AgentMessage"):
            said = "".join(text(part, "text") or "" for part in items(item, "content") if isinstance(part, dict))
            if item_type == "UserMessage":
                return self._user_input(said, client_id=text(item, "client_id"), item_id=item_id)
            return self._agent_output(said, item_id=item_id)
        if item_type == "CommandExecution":
            status = text(item, "status")
            return self._call_ended(item_id or f"call@{self._offset}", "commandExecution",
                                    text(item, "aggregated_output"), integer(item, "exit_code"),
                                    authoritative=True, status=status)
        return []

    def _user_input(self, said: str, *, client_id: str | None, item_id: str | None) -> list[Event]:
        events: list[Event] = []
        if not self._explicit_turns:
            # Old CLIs: each user message opens the next turn and ends the previous one.
            events += self._end_turn(None, "completed")
            events += self._start_turn(f"turn@{self._offset}")
        # A copy without the client id adds nothing; one with it carries the echo.
        if self._first_report("user", said, rich=item_id is not None) or client_id:
            events.append(self._user_message(said, client_id=client_id, item_id=item_id, **self._ids()))
        return events

    def _agent_output(self, said: str, *, item_id: str | None) -> list[Event]:
        if not self._first_report("agent", said, rich=item_id is not None):
            return []
        return [self._agent_message(said, item_id=item_id, **self._ids())]

    def _first_report(self, role: str, said: str, *, rich: bool) -> bool:
        """False when this message is the other record kind's copy of one already reported.

        Some versions write a message both as ``event_msg user_message`` /
        ``agent_message`` and as ``item_completed``; within a turn, equal digests
        from the two kinds are one message.
        """
        key = (role, digest(said))
        if self._said[(key, not rich)] > 0:
            self._said[(key, not rich)] -= 1
            return False
        self._said[(key, rich)] += 1
        return True

    # -- tool calls --------------------------------------------------------------------

    def _call_started(self, call_id: str, item_type: str, tool: str | None, command: str | None,
                      args) -> list[Event]:
        started = self._item_started(call_id, item_type, command=command, args=args, tool=tool, **self._ids())
        if not self._calls.start(call_id, Call(self._turn, item_type, tool, started.critical, started.external)):
            return []
        return [started]

    def _call_ended(self, call_id: str, item_type: str, output, exit_code: int | None, *,
                    authoritative: bool, status: str | None = None) -> list[Event]:
        call = self._calls.finish(call_id, authoritative=authoritative)
        if call is False:
            return []  # a repeat of a completion already reported
        if status is None:
            status = "completed" if exit_code in (None, 0) else "failed"
        # A tool output may arrive after its turn ended: it keeps its own turn.
        turn = call.turn_id if call else self._turn
        return [self._item_completed(
            call_id, call.item_type if call else item_type, output=output, status=status,
            exit_code=exit_code, tool=call.tool if call else None,
            flags=(call.critical, call.external) if call else None,
            thread_id=self._thread, turn_id=turn,
        )]

    def _begin(self, body: dict, kind: str) -> list[Event]:
        call_id = text(body, "call_id") or f"call@{self._offset}"
        if kind == "exec_command_begin":
            command = command_text(body.get("command"))
            return self._call_started(call_id, "commandExecution", "shell", command, body.get("command"))
        item_type = "fileChange" if kind == "patch_apply_begin" else "mcpToolCall"
        return self._call_started(call_id, item_type, None, None, None)

    def _end(self, body: dict, kind: str) -> list[Event]:
        call_id = text(body, "call_id") or f"call@{self._offset}"
        if kind == "exec_command_end":
            output = text(body, "aggregated_output") or text(body, "formatted_output") or text(body, "stdout")
            return self._call_ended(call_id, "commandExecution", output, integer(body, "exit_code"),
                                    authoritative=True)
        if kind == "patch_apply_end":
            ok = body.get("success")
            return self._call_ended(call_id, "fileChange", None, None, authoritative=True,
                                    status="failed" if ok is False else "completed")
        return self._call_ended(call_id, "mcpToolCall", None, None, authoritative=True)

    def _response_item(self, body: dict) -> list[Event]:
        kind = text(body, "type")
        if kind == "function_call":
            name = text(body, "name")
            arguments = body.get("arguments")
            call_id = text(body, "call_id") or f"call@{self._offset}"
            shell = name in SHELL_TOOLS
            command = _command_from_arguments(arguments) if shell else None
            return self._call_started(call_id, "commandExecution" if shell else "functionCall",
                                      name, command, arguments)
        if kind == "local_shell_call":
            call_id = text(body, "call_id") or text(body, "id") or f"call@{self._offset}"
            action = obj(body, "action")
            return self._call_started(call_id, "commandExecution", "local_shell",
                                      command_text(action.get("command")), action)
        if kind == "custom_tool_call":
            call_id = text(body, "call_id") or f"call@{self._offset}"
            return self._call_started(call_id, "customToolCall", text(body, "name"), None, body.get("input"))
        if kind in ("function_call_output", "custom_tool_call_output"):
            call_id = text(body, "call_id") or f"call@{self._offset}"
            output = body.get("output")
            if _still_running(output):
                # The tool answered the model, but its process goes on (unified exec
                # yields; an interrupt does not kill it): the end comes later or never.
                return []
            return self._call_ended(call_id, "functionCall", output, _exit_code(output), authoritative=False)
        if kind == "web_search_call":
            item_id = text(body, "id") or f"search@{self._offset}"
            return [self._item_completed(item_id, "webSearch", status=text(body, "status") or "completed",
                                         **self._ids())]
        if kind not in _QUIET_ITEMS:
            self.unknown_types[f"response_item:{kind}"] += 1
        return []


def _command_from_arguments(arguments) -> str | None:
    """The command inside a shell tool's arguments (a JSON string: ``cmd`` or ``command``)."""
    if isinstance(arguments, str):
        try:
            arguments = decode_json(arguments)
        except msgspec.DecodeError:
            return arguments  # not JSON: classify what the model sent
    if not isinstance(arguments, dict):
        return None
    return command_text(arguments.get("cmd", arguments.get("command")))


def _still_running(output) -> bool:
    return isinstance(output, str) and ("aborted by user" in output or "Process running with session ID" in output)


def _exit_code(output) -> int | None:
    """Exit code from a tool output: ``{"metadata": {"exit_code"}}`` JSON, or "Exit code: N" text."""
    if isinstance(output, dict):
        output = output.get("content")
    if not isinstance(output, str):
        return None
    if output.startswith("{"):
        try:
            decoded = decode_json(output)
        except msgspec.DecodeError:
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("metadata"), dict):
            code = decoded["metadata"].get("exit_code")
            return code if isinstance(code, int) else None
    found = _EXIT_CODE.search(output[:2000])
    return int(found.group(1)) if found else None
