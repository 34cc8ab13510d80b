"""``codex exec --json`` output: the ThreadEvent stream.

``thread.started{thread_id}`` → ``turn.started`` → ``item.started|updated|completed
{item:{id, type, …}}`` → ``turn.completed{usage}`` | ``turn.failed{error}`` | ``error``.
There are no timestamps and no turn ids: a turn's id is made from the byte offset
of its ``turn.started`` line. Item ids restart per process, which is fine since
they are only read together with their thread and turn. A stream may stop
mid-turn (the process died): that turn stays open and is counted as unclosed.
"""

from __future__ import annotations

from tillerman.ledger.events import Error, Event, ThreadStarted, TurnCompleted, TurnStarted
from tillerman.monitor.digest import digest
from tillerman.monitor.parser import Parser, integer, obj, text

# Item types of the stream → the app-server's item_type vocabulary.
_ITEM_TYPES = {
    "command_execution": "commandExecution",
    "file_change": "fileChange",
    "mcp_tool_call": "mcpToolCall",
    "web_search": "webSearch",
    "todo_list": "todoList",
    "collab_tool_call": "collabToolCall",
}
_QUIET_ITEMS = frozenset({"reasoning"})


class CodexExecParser(Parser):
    format = "codex-exec"
    untimed = True

    def __init__(self, source: str, **options) -> None:
        super().__init__(source, **options)
        self._thread: str | None = None
        self._turn: str | None = None

    def _ids(self) -> dict:
        return {"thread_id": self._thread, "turn_id": self._turn}

    def _events(self, record: dict) -> list[Event]:
        kind = text(record, "type")
        if kind == "thread.started":
            self._thread = text(record, "thread_id")
            return [ThreadStarted(thread_id=self._thread, source_format=self.format)]
        if kind == "turn.started":
            self._turn = f"turn@{self._offset}"
            return [TurnStarted(**self._ids())]
        if kind in ("turn.completed", "turn.failed"):
            events: list[Event] = []
            if kind == "turn.failed":
                message = text(obj(record, "error"), "message") or ""
                events.append(Error(message_digest=digest(message), **self._ids()))
            events.append(TurnCompleted(status="completed" if kind == "turn.completed" else "failed",
                                        **self._ids()))
            self._turn = None
            return events
        if kind == "error":
            return [Error(message_digest=digest(text(record, "message") or ""), **self._ids())]
        if kind in ("item.started", "item.updated", "item.completed"):
            return self._item(kind, obj(record, "item"))
        self.unknown_types[str(kind)] += 1
        return []

    def _item(self, step: str, item: dict) -> list[Event]:
        item_type = text(item, "type")
        item_id = text(item, "id") or f"item@{self._offset}"
        if item_type == "agent_message":
            if step != "item.completed":
                return []
            return [self._agent_message(text(item, "text") or "", item_id=item_id, **self._ids())]
        if item_type == "error":
            return [Error(message_digest=digest(text(item, "message") or ""), **self._ids())]
        if item_type in _QUIET_ITEMS or step == "item.updated":
            return []
        if item_type not in _ITEM_TYPES:
            self.unknown_types[f"item:{item_type}"] += 1
            return []
        mapped = _ITEM_TYPES[item_type]
        command = text(item, "command")
        if step == "item.started":
            return [self._item_started(item_id, mapped, command=command, args=command, **self._ids())]
        status = text(item, "status") or "completed"
        return [self._item_completed(
            item_id, mapped, command=command, args=command, output=text(item, "aggregated_output"),
            status=status, exit_code=integer(item, "exit_code"), **self._ids(),
        )]
