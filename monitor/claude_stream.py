"""Claude Code's stream-json output (``claude -p --output-format stream-json --verbose``):
what a harness reads from the CLI's stdout, recorded one JSON object a line.

Threads: the session (``session_id``). ``system/init`` is written once per turn in
stream-json-input mode; it opens the turn, whose id is the first of its
``user_message_uuids`` (the uuid the message was sent with, which is also the id the
transcript reader gives the same turn), else the init line's ``uuid``. The turn's
``result`` ends it: ``terminal_reason`` ``aborted_*`` (an interrupt, a
``priority: "now"`` message) is ``interrupted``, any other ``is_error`` (an API error)
``failed``, the rest ``completed``. CLIs older than ``terminal_reason`` (2.1.29 and
before) end an interrupted turn with a ``result`` that says neither, not even
``is_error``: there the interrupt marker the CLI wrote in the turn (a user line
``[Request interrupted by user…``) is what says it was interrupted.

Tools: ``assistant`` tool_use blocks start calls, ``user`` tool_result blocks end them,
with the same outcomes as in a transcript (``interrupted`` for a call stopped while
running, ``declined`` for one refused before it ran); a ``permission_decision`` in the
result's ``tool_result_meta`` is an ``approval_resolved`` (decision and source joined
by a colon, as in a transcript). A ``can_use_tool`` control request is an
``approval_requested`` for its tool call; a ``control_cancel_request`` for it (an
interrupt during the prompt) resolves it ``cancelled``.

The queue: ``command_lifecycle`` lines. ``queued`` adds an entry (its id and client
id are the message's uuid); ``started`` takes it off, ``delivered`` (it opens the next
turn, or is folded into the running one); ``cancelled`` while still queued takes it
off ``withdrawn`` (``cancel_async_message``, or an interrupt with ``cancel_queued``:
stdout alone does not tell them apart).

Lines of no consequence here (``control_response``, ``system`` task, status, hook and
``permission_denied`` lines, ``stream_event``, ``rate_limit_event``) are read quietly;
other types are counted as unknown.
"""

from __future__ import annotations

from typing import Any

from tillerman.ledger.events import (
    ApprovalRequested,
    ApprovalResolved,
    Event,
    QueueChanged,
    QueueEntry,
    QueueEntryRemoved,
    ThreadStarted,
    TurnCompleted,
    TurnStarted,
    TurnStatus,
    UsageReported,
)
from tillerman.ledger.usage import MAX_TOTAL_TOKENS, claude_tokens
from tillerman.monitor.claude_transcript import INTERRUPT_MARKER, content_blocks, model_usage, tool_status
from tillerman.monitor.costs import cost_usd
from tillerman.monitor.parser import Call, OpenCalls, Parser, WrongType, command_text, integer, iso_time, items, obj
from tillerman.monitor.parser import text as field
from tillerman.monitor.parser import workdir

_QUIET_TYPES = frozenset({"control_response", "stream_event", "rate_limit_event", "keep_alive"})
_SHELL_TOOLS = frozenset({"Bash", "BashOutput", "PowerShell"})
_REFUSED = frozenset({"user-rejected", "permission-rule"})


class ClaudeStreamParser(Parser):
    format = "claude-stream-json"

    def __init__(self, source: str, **options: Any) -> None:
        super().__init__(source, **options)
        self._session: str | None = None
        self._turn: str | None = None
        self._queue: dict[str, QueueEntry] = {}  # message uuid → entry, in the order queued
        self._calls = OpenCalls()
        self._prompts: dict[str, str] = {}  # can_use_tool request id → tool call id
        self._marked_interrupted = False  # the running turn holds the CLI's interrupt marker

    def _time(self, record: dict) -> float | None:
        return iso_time(record.get("timestamp"))

    def _events(self, record: dict) -> list[Event]:
        kind = field(record, "type")
        session = field(record, "session_id")
        opening: list[Event] = []
        if session and session != self._session:
            self._session = session
            opening.append(ThreadStarted(thread_id=session, source_format=self.format,
                                         **workdir(field(record, "cwd"), retain=self.retain_payloads)))
        reader = _READERS.get(kind or "")
        if reader is None:
            if kind not in _QUIET_TYPES:
                self.unknown_types[str(kind)] += 1
            return opening
        return opening + reader(self, record)

    @property
    def _ids(self) -> dict[str, str | None]:
        return {"thread_id": self._session, "turn_id": self._turn}

    # -- lines -------------------------------------------------------------------

    def _system(self, record: dict) -> list[Event]:
        if field(record, "subtype") != "init":
            return []  # task, status, hook and permission_denied lines
        uuids = [u for u in items(record, "user_message_uuids") if isinstance(u, str)]
        turn = uuids[0] if uuids else field(record, "uuid") or f"line@{self._offset}"
        if turn == self._turn:
            return []
        self._turn = turn  # one still open had no result: it stays unclosed, as stdout tells it
        self._marked_interrupted = False
        return [TurnStarted(**self._ids)]

    def _result(self, record: dict) -> list[Event]:
        reported = self._reported(record)  # refused: the line is quarantined, the turn left open
        reason = field(record, "terminal_reason") or ""
        status: TurnStatus
        if reason.startswith("aborted") or (not reason and self._marked_interrupted):
            status = "interrupted"
        else:
            status = "failed" if record.get("is_error") is True else "completed"
        return reported + self._end(status, integer(record, "duration_ms"))

    def _reported(self, record: dict) -> list[Event]:
        """The CLI's account on a ``result`` line: ``usage``, the query's own tokens (the
        sum of its responses); ``total_cost_usd`` and ``modelUsage``, cumulative since the
        process started (the latest counts, never a sum of results)."""
        usage, cost, models = record.get("usage"), record.get("total_cost_usd"), record.get("modelUsage")
        if usage is None and cost is None and models is None:
            return []
        return [UsageReported(source_kind="claude_stream", cost_usd=cost_usd(cost, "total_cost_usd"),
                              tokens=None if usage is None else claude_tokens(usage, limit=MAX_TOTAL_TOKENS),
                              models=model_usage(models), **self._ids)]

    def _end(self, status: TurnStatus, duration_ms: int | None = None) -> list[Event]:
        if self._turn is None:
            return []
        event = TurnCompleted(status=status, duration_ms=duration_ms, **self._ids)
        self._turn = None
        self._marked_interrupted = False
        return [event]

    def _assistant(self, record: dict) -> list[Event]:
        message = obj(record, "message")
        events: list[Event] = []
        uuid = field(record, "uuid") or f"line@{self._offset}"
        for block in _message_blocks(message):
            kind = block.get("type")
            if kind == "text":
                events.append(self._agent_message(field(block, "text") or "", item_id=uuid, **self._ids))
            elif kind == "tool_use":
                name = field(block, "name")
                tool_input = obj(block, "input")
                item_type = "commandExecution" if name in _SHELL_TOOLS else "toolCall"
                command = command_text(tool_input.get("command")) if item_type == "commandExecution" else None
                started = self._item_started(field(block, "id") or f"tool@{self._offset}", item_type,
                                             command=command, args=tool_input, tool=name, **self._ids)
                self._calls.start(started.item_id, Call(self._turn, item_type, name, started.critical,
                                                        started.external))
                events.append(started)
        return events

    def _user(self, record: dict) -> list[Event]:
        message = obj(record, "message")
        metas = {field(meta, "id"): meta for meta in items(record, "tool_result_meta") if isinstance(meta, dict)}
        events: list[Event] = []
        said: list[str] = []
        for block in _message_blocks(message):
            if block.get("type") == "tool_result":
                events += self._tool_result(record, block, metas.get(field(block, "tool_use_id")) or {})
            elif block.get("type") == "text":
                said.append(field(block, "text") or "")
        prompt = "\n".join(said)
        if any(line.startswith(INTERRUPT_MARKER) for line in said):
            self._marked_interrupted = True
        if said and not events and record.get("isReplay") and not prompt.startswith(INTERRUPT_MARKER):
            # With --replay-user-messages: a message as it reached the model.
            events.append(self._user_message(prompt, item_id=field(record, "uuid"), **self._ids))
        return events

    def _tool_result(self, record: dict, block: dict, meta: dict) -> list[Event]:
        tool_use_id = field(block, "tool_use_id") or f"tool@{self._offset}"
        call = self._calls.finish(tool_use_id, authoritative=True)
        if call is False:
            return []
        started = call if isinstance(call, Call) else None
        ids = {"thread_id": self._session, "turn_id": started.turn_id if started else self._turn}
        events: list[Event] = []
        decision = obj(meta, "permission_decision")
        if decision:
            said, source = field(decision, "decision") or "", field(decision, "source")
            events.append(ApprovalResolved(item_id=tool_use_id, decision=f"{said}:{source}" if source else said,
                                           **ids))
        result = record.get("tool_use_result")
        denied = field(meta, "non_execution_kind") in _REFUSED or result == "User rejected tool use"
        events.append(self._item_completed(
            tool_use_id, started.item_type if started else "toolCall", output=block.get("content"),
            status=tool_status(result, denied, block), tool=started.tool if started else None,
            flags=(started.critical, started.external) if started else None, **ids))
        return events

    def _control_request(self, record: dict) -> list[Event]:
        request = obj(record, "request")
        if field(request, "subtype") != "can_use_tool":
            return []
        tool_use_id = field(request, "tool_use_id") or f"tool@{self._offset}"
        request_id = field(record, "request_id")
        if request_id:
            self._prompts[request_id] = tool_use_id
        return [ApprovalRequested(item_id=tool_use_id, **self._ids)]

    def _control_cancel(self, record: dict) -> list[Event]:
        tool_use_id = self._prompts.pop(field(record, "request_id") or "", None)
        return [] if tool_use_id is None else [ApprovalResolved(item_id=tool_use_id, decision="cancelled",
                                                                **self._ids)]

    def _lifecycle(self, record: dict) -> list[Event]:
        uuid = field(record, "command_uuid")
        state = field(record, "state")
        if uuid is None:
            raise WrongType("command_uuid")
        if state == "queued":
            self._queue[uuid] = QueueEntry(id=uuid, client_id=uuid)
            return [self._queue_changed()]
        entry = self._queue.pop(uuid, None)
        if entry is None or state not in ("started", "cancelled"):
            return []  # completed, or a command never seen queued
        outcome = "delivered" if state == "started" else "withdrawn"
        removed = QueueEntryRemoved(entry_id=entry.id, outcome=outcome, client_id=uuid, reason=state, **self._ids)
        return [removed, self._queue_changed()]

    def _queue_changed(self) -> QueueChanged:
        return QueueChanged(entries=tuple(self._queue.values()), known=True, **self._ids)


_READERS = {
    "system": ClaudeStreamParser._system,
    "result": ClaudeStreamParser._result,
    "assistant": ClaudeStreamParser._assistant,
    "user": ClaudeStreamParser._user,
    "control_request": ClaudeStreamParser._control_request,
    "control_cancel_request": ClaudeStreamParser._control_cancel,
    "command_lifecycle": ClaudeStreamParser._lifecycle,
}


def _message_blocks(message: dict) -> list[dict]:
    content = message.get("content")
    return [{"type": "text", "text": content}] if isinstance(content, str) else content_blocks(content)
