"""Claude Code transcripts (``~/.claude/projects/<project>/<sessionId>.jsonl``).

Threads: the main conversation is the session (``sessionId``). Subagent traffic —
``isSidechain`` lines interleaved in 1.0.x files, and 2.1.x files
``<sessionId>/subagents/agent-<id>.jsonl`` — is its own thread,
``<sessionId>/agent-<agentId>`` (``<sessionId>/sidechain`` when a line names no
agent), whose parent is the session.

Turns: a user line whose content is text (not a tool result, not ``isMeta``, not a
compaction summary) opens a turn; its id is that line's ``uuid``. The turn ends at
an assistant ``stop_reason: "end_turn"``, a ``system`` ``stop_hook_summary`` or
``turn_duration``, whichever comes first; an interrupt marker
(``[Request interrupted by user…]``) ends it ``interrupted``. A new prompt while a
turn is still open leaves that turn unclosed: folded mid-turn input is never a
user line of its own but a ``queued_command`` attachment, read as a user message
of the open turn.

The queue: ``queue-operation`` lines (enqueue, dequeue, remove, popAll) are
applied to a queue the parser keeps, and each change is reported with the full
entries. An entry's id is the offset of its enqueue line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import ClassVar

from ledger.events import Error, Event, QueueChanged, QueueEntry, ThreadStarted, TurnCompleted, TurnStarted
from monitor.digest import digest
from monitor.parser import Call, OpenCalls, Parser, WrongType, command_text, integer, iso_time, obj, text

_SUBAGENT_FILE = re.compile(r"(?:^|[/\\])([^/\\]+)[/\\]subagents[/\\]agent-([^/\\]+)\.jsonl$")
INTERRUPT_MARKER = "[Request interrupted by user"
_QUIET_TYPES = frozenset({
    "summary", "progress", "file-history-snapshot", "last-prompt", "cost-state", "api-request-shape",
    "api-request-blob", "api-request", "tools-used", "atis-latch", "custom-title", "tag", "agent-name",
    "pr-link",
})
_SHELL_TOOLS = frozenset({"Bash", "BashOutput", "PowerShell"})


class _Thread:
    __slots__ = ("turn",)

    def __init__(self) -> None:
        self.turn: str | None = None  # the open turn


class ClaudeTranscriptParser(Parser):
    format = "claude-transcript"
    _HANDLERS: ClassVar[dict[str, Callable[..., list[Event]]]]  # line type → reader, set below

    def __init__(self, source: str, **options) -> None:
        super().__init__(source, **options)
        found = _SUBAGENT_FILE.search(source)
        self._file_session, self._file_agent = (found.group(1), found.group(2)) if found else (None, None)
        self._threads: dict[str, _Thread] = {}
        self._queue: list[QueueEntry] = []
        self._calls = OpenCalls()

    def _time(self, record: dict) -> float | None:
        return iso_time(record.get("timestamp"))

    def _events(self, record: dict) -> list[Event]:
        kind = text(record, "type")
        session = text(record, "sessionId") or self._file_session
        if kind == "queue-operation":
            changed = self._queue_operation(record, session)
            return self._thread_opening(session, None, _Thread()) + changed
        handler = self._HANDLERS.get(kind)
        if handler is None:
            if kind not in _QUIET_TYPES:
                self.unknown_types[str(kind)] += 1
            return []
        thread_id, parent = self._thread_of(record, session)
        state = self._threads.get(thread_id) or _Thread()
        # The line is read before its thread is registered: a line quarantined for a
        # wrong type must not swallow the thread's opening.
        body = handler(self, record, thread_id, state)
        return self._thread_opening(thread_id, parent, state) + body

    def _thread_of(self, record: dict, session: str | None) -> tuple[str | None, str | None]:
        agent = text(record, "agentId") or self._file_agent
        sidechain = record.get("isSidechain")
        if not isinstance(sidechain, (bool, type(None))):
            raise WrongType("isSidechain")
        if not (sidechain or self._file_agent) or session is None:
            return session, None
        return f"{session}/agent-{agent}" if agent else f"{session}/sidechain", session

    def _thread_opening(self, thread_id: str | None, parent: str | None, state: _Thread) -> list[Event]:
        if thread_id is None or thread_id in self._threads:
            return []
        self._threads[thread_id] = state
        return [ThreadStarted(thread_id=thread_id, parent_thread_id=parent, source_format=self.format)]

    def _end(self, thread_id: str | None, state: _Thread, status: str, duration_ms: int | None = None) -> list[Event]:
        if state.turn is None:
            return []
        turn, state.turn = state.turn, None
        return [TurnCompleted(thread_id=thread_id, turn_id=turn, status=status, duration_ms=duration_ms)]

    # -- lines -------------------------------------------------------------------

    def _user(self, record: dict, thread_id: str | None, state: _Thread) -> list[Event]:
        content = obj(record, "message").get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else _blocks(content)
        events: list[Event] = []
        said: list[str] = []
        for block in blocks:
            if block.get("type") == "tool_result":
                events.append(self._tool_result(record, block, thread_id, state))
            elif block.get("type") == "text":
                said.append(text(block, "text") or "")
        prompt = "\n".join(said)
        if prompt.startswith(INTERRUPT_MARKER):
            return events + self._end(thread_id, state, "interrupted")
        if not said or record.get("isMeta") or record.get("isCompactSummary") or events:
            return events
        uuid = text(record, "uuid") or f"line@{self._offset}"
        # A new prompt opens the next turn; one still open stays unclosed.
        state.turn = uuid
        ids = {"thread_id": thread_id, "turn_id": uuid}
        return [TurnStarted(**ids), self._user_message(prompt, item_id=uuid, **ids)]

    def _tool_result(self, record: dict, block: dict, thread_id: str | None, state: _Thread) -> Event:
        tool_use_id = text(block, "tool_use_id") or f"tool@{self._offset}"
        if record.get("toolDenialKind") or record.get("toolUseResult") == "User rejected tool use":
            status = "declined"
        else:
            status = "failed" if block.get("is_error") else "completed"
        call = self._calls.finish(tool_use_id, authoritative=True)
        started = call if isinstance(call, Call) else None  # unseen start, or a repeated result
        return self._item_completed(
            tool_use_id, started.item_type if started else "toolCall", output=block.get("content"), status=status,
            tool=started.tool if started else None, flags=(started.critical, started.external) if started else None,
            thread_id=thread_id, turn_id=started.turn_id if started else state.turn)

    def _assistant(self, record: dict, thread_id: str | None, state: _Thread) -> list[Event]:
        message = obj(record, "message")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else _blocks(content)
        ids = {"thread_id": thread_id, "turn_id": state.turn}
        uuid = text(record, "uuid") or f"line@{self._offset}"
        events: list[Event] = []
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                events.append(self._agent_message(text(block, "text") or "", item_id=uuid, **ids))
            elif kind == "tool_use":
                name = text(block, "name")
                tool_input = obj(block, "input")
                item_type = "commandExecution" if name in _SHELL_TOOLS else "toolCall"
                command = command_text(tool_input.get("command")) if item_type == "commandExecution" else None
                started = self._item_started(text(block, "id") or f"tool@{self._offset}", item_type,
                                             command=command, args=tool_input, tool=name, **ids)
                self._calls.start(started.item_id, Call(state.turn, item_type, name, started.critical,
                                                        started.external))
                events.append(started)
        if record.get("isApiErrorMessage"):
            events.append(Error(message_digest=digest(content if isinstance(content, str) else repr(content)), **ids))
        if text(message, "stop_reason") == "end_turn":
            events += self._end(thread_id, state, "completed")
        return events

    def _system(self, record: dict, thread_id: str | None, state: _Thread) -> list[Event]:
        subtype = text(record, "subtype")
        if subtype == "stop_hook_summary":
            return self._end(thread_id, state, "completed")
        if subtype == "turn_duration":
            return self._end(thread_id, state, "completed", integer(record, "durationMs"))
        if subtype == "api_error":
            message = record.get("error", record.get("content", ""))
            return [Error(message_digest=digest(message if message is not None else ""), thread_id=thread_id,
                          turn_id=state.turn)]
        return []

    def _attachment(self, record: dict, thread_id: str | None, state: _Thread) -> list[Event]:
        attachment = obj(record, "attachment")
        if attachment.get("type") != "queued_command":
            return []
        # Input folded into the running turn (2.1.x): a steer of the open turn.
        prompt = attachment.get("prompt")
        if not isinstance(prompt, str):  # a prompt with images is a list of blocks
            prompt = "\n".join(text(block, "text") or "" for block in _blocks(prompt) if block.get("type") == "text")
        item_id = text(attachment, "source_uuid") or text(record, "uuid")
        return [self._user_message(prompt, item_id=item_id, thread_id=thread_id, turn_id=state.turn)]

    # -- the queue -------------------------------------------------------------------

    def _queue_operation(self, record: dict, session: str | None) -> list[Event]:
        operation = text(record, "operation")
        content = record.get("content")
        entry_digest = None if content is None else digest(content)
        if operation == "enqueue":
            self._queue.append(QueueEntry(id=f"queued@{self._offset}", digest=entry_digest))
        elif operation == "dequeue":
            del self._queue[:1]
        elif operation == "remove":
            # Names the removed text, not the entry: the first entry with that text goes.
            match = next((e for e in self._queue if e.digest == entry_digest), None)
            if match is not None:
                self._queue.remove(match)
        elif operation == "popAll":
            self._queue.clear()
        else:
            self.unknown_types[f"queue-operation:{operation}"] += 1
            return []
        turn = self._threads[session].turn if session in self._threads else None
        return [QueueChanged(entries=tuple(self._queue), known=True, thread_id=session, turn_id=turn)]


ClaudeTranscriptParser._HANDLERS = {
    "user": ClaudeTranscriptParser._user,
    "assistant": ClaudeTranscriptParser._assistant,
    "system": ClaudeTranscriptParser._system,
    "attachment": ClaudeTranscriptParser._attachment,
}


def _blocks(content) -> list[dict]:
    if content is None:
        return []
    if not isinstance(content, list):
        raise WrongType("content")
    return [block for block in content if isinstance(block, dict)]
