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

import os
import re
from collections import Counter
from collections.abc import Callable
from typing import Any, Union

import msgspec

from tillerman.ledger.events import (
    Error,
    Event,
    GoalUpdated,
    ThreadNamed,
    ThreadStarted,
    TurnCompleted,
    TurnStarted,
    Usage,
)
from tillerman.ledger.usage import (
    CODEX_ROLLOUT_NAMES,
    MAX_TOTAL_TOKENS,
    ZERO,
    Tokens,
    UsageRefused,
    codex_response_key,
    codex_tokens,
    count,
    difference,
)
from tillerman.monitor.digest import digest, payload
from tillerman.monitor.lines import TypedLines, decode_json, nested
from tillerman.monitor.parser import (
    Call,
    OpenCalls,
    Parser,
    WrongType,
    as_integer,
    as_list,
    as_obj,
    as_text,
    command_text,
    git_branch,
    integer,
    iso_time,
    obj,
    text,
    workdir,
)

THREAD_FROM_PATH = re.compile(r"rollout-[0-9T:-]+-([0-9a-fA-F-]{36})\.jsonl")


def rollout_thread_from_path(path: str) -> str | None:
    """The thread a rollout's file name gives it before any ``session_meta``: the id in
    Codex's ``rollout-<time>-<id>.jsonl``, else (a renamed or copied file) the file's own
    name without ``.jsonl``, so that two such files are two threads, as ccusage keys them
    by path, and not one thread with no id whose counters seem to go back between files.
    None for a source that is no file name (standard input)."""
    found = THREAD_FROM_PATH.search(path)
    if found:
        return found.group(1)
    name = os.path.basename(path)
    return name.removesuffix(".jsonl") if name.endswith(".jsonl") and name != ".jsonl" else None


_EXIT_CODE = re.compile(r"(?:Exit code|exited with code)[:\s]+(-?\d+)")

SHELL_TOOLS = frozenset({"shell", "exec_command", "container.exec", "shell_command", "local_shell"})

_QUIET_TYPES = frozenset({"compacted", "world_state", "token_usage_record",
                          "inter_agent_communication_metadata"})
_QUIET_EVENTS = frozenset({
    "agent_reasoning", "agent_reasoning_raw_content", "agent_reasoning_section_break",
    "context_compacted", "thread_settings_applied", "entered_review_mode", "exited_review_mode",
    "plan_update", "turn_diff", "background_event", "undo_started",
    "undo_completed", "view_image_tool_call", "web_search_begin", "web_search_end",
})
_QUIET_ITEMS = frozenset({"message", "reasoning", "ghost_snapshot", "compaction"})


# -- the records, as Structs ---------------------------------------------------------
# A Struct per record type that yields events, tagged by ``type``, declaring only the
# fields read. Fields are ``Any`` and checked where they are read, exactly as a dict's
# would be (a wrong type quarantines the record only when the reading reaches it).
# Quiet types are Structs with no fields: their bodies are skipped, not decoded.
# Anything else (an unknown type, a body that is no object) stays a dict: ``_untyped``.


class _Object(msgspec.Struct):
    """Any JSON object, its fields unread."""


class _Tagged(msgspec.Struct, tag_field="type"):
    pass


def _quiet(tags: frozenset[str], base: type = _Tagged) -> tuple[type, ...]:
    """A Struct with no fields of its own for each of ``tags``."""
    return tuple(msgspec.defstruct(f"Quiet_{tag}", [], bases=(base,), tag=tag) for tag in sorted(tags))


# event_msg bodies
class _TaskStarted(_Tagged, tag="task_started"):
    turn_id: Any = None
    turn_attribution: Any = None  # 0.171: {"turn_trigger": "goal" | "queue" | null, …}


class _GoalUpdated(_Tagged, tag="thread_goal_updated"):
    goal: Any = None


class _ThreadNameUpdated(_Tagged, tag="thread_name_updated"):
    thread_name: Any = None  # absent: the name was cleared


class _TokenCount(_Tagged, tag="token_count"):
    info: Any = None  # null: only the rate limits changed


class _TaskComplete(_Tagged, tag="task_complete"):
    turn_id: Any = None
    duration_ms: Any = None


class _TurnAborted(_TaskComplete, tag="turn_aborted"):
    pass


class _UserMessage(_Tagged, tag="user_message"):
    message: Any = None


class _AgentMessage(_UserMessage, tag="agent_message"):
    pass


class _ErrorMsg(_UserMessage, tag="error"):
    pass


class _StreamError(_UserMessage, tag="stream_error"):
    pass


class _Item(msgspec.Struct):
    """A completed item (0.163): the fields any item type's events read."""

    type: Any = None
    id: Any = None
    client_id: Any = None
    content: Any = None
    status: Any = None
    aggregated_output: Any = None
    exit_code: Any = None


class _ItemCompleted(_Tagged, tag="item_completed"):
    # Any JSON value but an object is taken too, to be refused where it is read (a wrong type).
    item: _Item | list | str | int | float | bool | None = None


class _ExecBegin(_Tagged, tag="exec_command_begin"):
    call_id: Any = None
    command: Any = None


class _PatchBegin(_Tagged, tag="patch_apply_begin"):
    call_id: Any = None


class _McpBegin(_PatchBegin, tag="mcp_tool_call_begin"):
    pass


class _ExecEnd(_Tagged, tag="exec_command_end"):
    call_id: Any = None
    aggregated_output: Any = None
    formatted_output: Any = None
    stdout: Any = None
    exit_code: Any = None


class _PatchEnd(_Tagged, tag="patch_apply_end"):
    call_id: Any = None
    success: Any = None


class _McpEnd(_PatchBegin, tag="mcp_tool_call_end"):
    pass


# response_item bodies
class _FunctionCall(_Tagged, tag="function_call"):
    name: Any = None
    arguments: Any = None
    call_id: Any = None


class _LocalShellCall(_Tagged, tag="local_shell_call"):
    call_id: Any = None
    id: Any = None
    action: Any = None


class _CustomToolCall(_Tagged, tag="custom_tool_call"):
    call_id: Any = None
    name: Any = None
    input: Any = None


class _FunctionCallOutput(_Tagged, tag="function_call_output"):
    call_id: Any = None
    output: Any = None


class _CustomToolCallOutput(_FunctionCallOutput, tag="custom_tool_call_output"):
    pass


class _WebSearchCall(_Tagged, tag="web_search_call"):
    id: Any = None
    status: Any = None


class _SessionMetaBody(msgspec.Struct):
    id: Any = None
    forked_from_id: Any = None
    parent_thread_id: Any = None
    source: Any = None
    originator: Any = None
    cli_version: Any = None
    cwd: Any = None
    git: Any = None  # {"commit_hash", "branch", "repository_url"}


class _Line(_Tagged):
    timestamp: Any = None


class _TurnContextBody(msgspec.Struct):
    turn_id: Any = None  # 0.163 and later
    model: Any = None


class _SessionMeta(_Line, tag="session_meta"):
    payload: _SessionMetaBody | None = None


class _TurnContext(_Line, tag="turn_context"):
    payload: _TurnContextBody | None = None


class _EventMsg(_Line, tag="event_msg", kw_only=True):
    payload: Union[_EVENT_BODIES]  # noqa: UP007 (a union built from a tuple)


class _ResponseItem(_Line, tag="response_item", kw_only=True):
    payload: Union[_ITEM_BODIES]  # noqa: UP007


class _QuietLine(_Line):
    payload: _Object | None = None  # read by no event, but a body that is no object is refused


_EVENT_BODIES = (_TaskStarted, _TaskComplete, _TurnAborted, _UserMessage, _AgentMessage, _ErrorMsg, _StreamError,
                 _ItemCompleted, _ExecBegin, _PatchBegin, _McpBegin, _ExecEnd, _PatchEnd, _McpEnd, _GoalUpdated,
                 _TokenCount, _ThreadNameUpdated, *_quiet(_QUIET_EVENTS))
_ITEM_BODIES = (_FunctionCall, _LocalShellCall, _CustomToolCall, _FunctionCallOutput, _CustomToolCallOutput,
                _WebSearchCall, *_quiet(_QUIET_ITEMS))
_LINES = TypedLines(Union[(_SessionMeta, _TurnContext, _EventMsg, _ResponseItem, *_quiet(_QUIET_TYPES, _QuietLine))])  # noqa: UP007


class CodexRolloutParser(Parser):
    format = "codex-rollout"
    lines = _LINES

    def __init__(self, source: str, **options) -> None:
        super().__init__(source, **options)
        self._thread: str | None = rollout_thread_from_path(source)
        self._turn: str | None = None  # the open turn
        self._explicit_turns = False  # the file has task_started: real turn ids
        self._calls = OpenCalls()
        # Messages reported in the open turn, to recognise a second copy (``_first_report``).
        self._said: Counter[tuple[tuple[str, str], bool]] = Counter()
        # Usage: the latest turn_context's model and turn, and the file's running total.
        self._model: str | None = None
        self._context_turn: str | None = None
        self._total: Tokens | None = None

    def _time(self, record: _Line | dict) -> float | None:
        return iso_time(self._stamp(record))

    def _stamp(self, record: _Line | dict) -> str | None:
        stamp = record.get("timestamp") if record.__class__ is dict else record.timestamp
        if stamp is None or stamp.__class__ is str:
            return stamp
        raise WrongType("timestamp")

    def _seconds(self, stamp: str | None) -> float | None:
        return iso_time(stamp)

    def _events(self, record: _Line | dict) -> list[Event]:
        kind = record.__class__
        if kind is _EventMsg or kind is _ResponseItem:  # nearly every record: one look-up
            handler = _BODY_HANDLERS.get(record.payload.__class__)
            return handler(self, record.payload) if handler is not None else []  # None: a quiet type
        handler = _RECORD_HANDLERS.get(kind)
        return handler(self, record) if handler is not None else []

    def _session_meta_record(self, record: _SessionMeta) -> list[Event]:
        return self._session_meta(record.payload or _SessionMetaBody())

    def _untyped(self, record: dict) -> list[Event]:
        """A record outside the Structs: an unknown type, or a body that is no object."""
        kind = text(record, "type")
        body = obj(record, "payload")
        if kind in ("event_msg", "response_item"):
            self.unknown_types[f"{kind}:{text(body, 'type')}"] += 1
        elif kind not in _QUIET_TYPES:
            self.unknown_types[str(kind)] += 1
        return []

    # -- session and turns -------------------------------------------------------

    def _session_meta(self, body: _SessionMetaBody) -> list[Event]:
        self._thread = as_text(body.id, "id") or self._thread
        parent = as_text(body.forked_from_id, "forked_from_id") or as_text(body.parent_thread_id, "parent_thread_id")
        source = nested(body.source, 3)
        if isinstance(source, dict):  # subagents: {"subagent": {"thread_spawn": {"parent_thread_id"}}}
            spawn = obj(obj(source, "subagent"), "thread_spawn")
            parent = parent or text(spawn, "parent_thread_id")
        return [ThreadStarted(
            thread_id=self._thread, parent_thread_id=parent, originator=as_text(body.originator, "originator"),
            cli_version=as_text(body.cli_version, "cli_version"), source_format=self.format,
            **workdir(as_text(body.cwd, "cwd"), retain=self.retain_payloads,
                      branch=git_branch(body.git)),
        )]

    def _start_turn(self, turn_id: str, trigger: str | msgspec.UnsetType = msgspec.UNSET) -> list[Event]:
        self._turn = turn_id
        self._said.clear()
        return [TurnStarted(thread_id=self._thread, turn_id=self._turn, trigger=trigger)]

    def _end_turn(self, turn_id: str | None, status: str, duration_ms: int | None = None) -> list[Event]:
        turn_id = turn_id or self._turn
        if turn_id is None:
            return []
        if turn_id == self._turn:
            self._turn = None
        return [TurnCompleted(thread_id=self._thread, turn_id=turn_id, status=status, duration_ms=duration_ms)]

    def _turn_context(self, record: _TurnContext) -> list[Event]:
        """The settings a turn runs with: its model, which the usage records after it
        were produced by (a ``token_count`` names none)."""
        body = record.payload or _TurnContextBody()
        self._model = as_text(body.model, "model")
        self._context_turn = as_text(body.turn_id, "turn_id")
        return []

    # -- event_msg -------------------------------------------------------------------

    def _task_started(self, body: _TaskStarted) -> list[Event]:
        self._explicit_turns = True
        return self._start_turn(as_text(body.turn_id, "turn_id") or f"turn@{self._offset}",
                                _trigger(body.turn_attribution))

    def _goal_updated(self, body: _GoalUpdated) -> list[Event]:
        """The goal as set by a client or changed by the model's ``update_goal`` (0.171
        writes these; its budget accounting's updates and a clear are not written)."""
        goal = as_obj(nested(body.goal, 3), "goal") or {}
        status = text(goal, "status")
        if status is None:
            return []
        objective = text(goal, "objective")
        p = payload(objective, retain=self.retain_payloads) if objective is not None else None
        return [GoalUpdated(thread_id=self._thread, turn_id=self._turn, status=status,
                            objective_digest=p.digest if p else None, objective=p.text if p else None,
                            token_budget=integer(goal, "tokenBudget"), tokens_used=integer(goal, "tokensUsed"),
                            time_used_seconds=_seconds_used(goal.get("timeUsedSeconds")))]

    def _token_count(self, body: _TokenCount) -> list[Event]:
        """One response's usage on the turn of the ``turn_context`` before it (the open
        turn where that names none), refused with its reason when a figure is bad."""
        used = token_count_usage({"info": nested(body.info, 3)}, thread_id=self._thread,
                                 turn_id=self._context_turn or self._turn, model=self._model,
                                 previous_total=self._total)
        if used is None:
            return []
        self._total = used.total
        return [used]

    def _thread_name_updated(self, body: _ThreadNameUpdated) -> list[Event]:
        """``thread_name_updated {thread_id, thread_name?}``: the thread's name (``/rename``,
        ``thread/name/set``), on the file's thread."""
        return [ThreadNamed.of(self._thread, as_text(body.thread_name, "thread_name"))]

    def _task_complete(self, body: _TaskComplete) -> list[Event]:
        status = "interrupted" if isinstance(body, _TurnAborted) else "completed"
        return self._end_turn(as_text(body.turn_id, "turn_id"), status, as_integer(body.duration_ms, "duration_ms"))

    def _user_message_msg(self, body: _UserMessage) -> list[Event]:
        return self._user_input(as_text(body.message, "message") or "", client_id=None, item_id=None)

    def _agent_message_msg(self, body: _AgentMessage) -> list[Event]:
        return self._agent_output(as_text(body.message, "message") or "", item_id=None)

    def _error_msg(self, body: _ErrorMsg | _StreamError) -> list[Event]:
        return [Error(message_digest=digest(as_text(body.message, "message") or ""), thread_id=self._thread, turn_id=self._turn)]

    def _item_completed_msg(self, body: _ItemCompleted) -> list[Event]:
        """0.163 writes user input, agent output and commands as completed items."""
        item = body.item
        if item.__class__ is not _Item:
            if item is None:
                return []
            nested(item, 3)  # an array nested too deep is refused as such
            raise WrongType("item")
        item_type = as_text(item.type, "type")
        item_id = as_text(item.id, "id")
        if item_type in ("UserMessage", "AgentMessage"):
            content = as_list(nested(item.content, 4), "content")
            said = "".join(text(part, "text") or "" for part in content if isinstance(part, dict))
            if item_type == "UserMessage":
                return self._user_input(said, client_id=as_text(item.client_id, "client_id"), item_id=item_id)
            return self._agent_output(said, item_id=item_id)
        if item_type == "CommandExecution":
            status = as_text(item.status, "status")
            return self._call_ended(item_id or f"call@{self._offset}", "commandExecution",
                                    as_text(item.aggregated_output, "aggregated_output"),
                                    as_integer(item.exit_code, "exit_code"), authoritative=True, status=status)
        return []

    def _user_input(self, said: str, *, client_id: str | None, item_id: str | None) -> list[Event]:
        events: list[Event] = []
        if not self._explicit_turns:
            # Old CLIs: each user message opens the next turn and ends the previous one.
            events += self._end_turn(None, "completed")
            events += self._start_turn(f"turn@{self._offset}")
        # A copy without the client id adds nothing; one with it carries the echo.
        if self._first_report("user", said, rich=item_id is not None) or client_id:
            events.append(self._user_message(said, client_id=client_id, item_id=item_id, thread_id=self._thread, turn_id=self._turn))
        return events

    def _agent_output(self, said: str, *, item_id: str | None) -> list[Event]:
        if not self._first_report("agent", said, rich=item_id is not None):
            return []
        return [self._agent_message(said, item_id=item_id, thread_id=self._thread, turn_id=self._turn)]

    def _first_report(self, role: str, said: str, *, rich: bool) -> bool:
        """False when this message is the other record kind's copy of one already reported.

        Some versions write a message both as ``event_msg user_message`` /
        ``agent_message`` and as ``item_completed``; within a turn, equal texts from
        the two kinds are one message (the texts are kept, not hashed, until the turn ends).
        """
        key = (role, said)
        if self._said[(key, not rich)] > 0:
            self._said[(key, not rich)] -= 1
            return False
        self._said[(key, rich)] += 1
        return True

    # -- tool calls --------------------------------------------------------------------

    def _call_started(self, call_id: str, item_type: str, tool: str | None, command: str | None,
                      args) -> list[Event]:
        started = self._item_started(call_id, item_type, command=command, args=args, tool=tool, thread_id=self._thread, turn_id=self._turn)
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

    def _call_id(self, body: Any) -> str:
        return as_text(body.call_id, "call_id") or f"call@{self._offset}"

    def _exec_begin(self, body: _ExecBegin) -> list[Event]:
        call_id = self._call_id(body)
        command = nested(body.command, 3)
        return self._call_started(call_id, "commandExecution", "shell", command_text(command), command)

    def _patch_begin(self, body: _PatchBegin) -> list[Event]:
        return self._call_started(self._call_id(body), "fileChange", None, None, None)

    def _mcp_begin(self, body: _McpBegin) -> list[Event]:
        return self._call_started(self._call_id(body), "mcpToolCall", None, None, None)

    def _exec_end(self, body: _ExecEnd) -> list[Event]:
        call_id = self._call_id(body)
        output = (as_text(body.aggregated_output, "aggregated_output")
                  or as_text(body.formatted_output, "formatted_output") or as_text(body.stdout, "stdout"))
        return self._call_ended(call_id, "commandExecution", output, as_integer(body.exit_code, "exit_code"),
                                authoritative=True)

    def _patch_end(self, body: _PatchEnd) -> list[Event]:
        return self._call_ended(self._call_id(body), "fileChange", None, None, authoritative=True,
                                status="failed" if body.success is False else "completed")

    def _mcp_end(self, body: _McpEnd) -> list[Event]:
        return self._call_ended(self._call_id(body), "mcpToolCall", None, None, authoritative=True)

    # -- response_item -----------------------------------------------------------------

    def _function_call(self, body: _FunctionCall) -> list[Event]:
        name = as_text(body.name, "name")
        arguments = nested(body.arguments, 3)
        call_id = self._call_id(body)
        shell = name in SHELL_TOOLS
        command = _command_from_arguments(arguments) if shell else None
        return self._call_started(call_id, "commandExecution" if shell else "functionCall", name, command, arguments)

    def _local_shell_call(self, body: _LocalShellCall) -> list[Event]:
        call_id = as_text(body.call_id, "call_id") or as_text(body.id, "id") or f"call@{self._offset}"
        action = as_obj(nested(body.action, 3), "action")
        return self._call_started(call_id, "commandExecution", "local_shell", command_text(action.get("command")),
                                  action)

    def _custom_tool_call(self, body: _CustomToolCall) -> list[Event]:
        call_id = self._call_id(body)
        return self._call_started(call_id, "customToolCall", as_text(body.name, "name"), None, nested(body.input, 3))

    def _function_call_output(self, body: _FunctionCallOutput) -> list[Event]:
        call_id = self._call_id(body)
        output = nested(body.output, 3)
        if self._calls.repeated(call_id, authoritative=False):
            return []  # reported already: its output need not be read
        if _still_running(output):
            # The tool answered the model, but its process goes on (unified exec
            # yields; an interrupt does not kill it): the end comes later or never.
            return []
        return self._call_ended(call_id, "functionCall", output, _exit_code(output), authoritative=False)

    def _web_search_call(self, body: _WebSearchCall) -> list[Event]:
        item_id = as_text(body.id, "id") or f"search@{self._offset}"
        return [self._item_completed(item_id, "webSearch", status=as_text(body.status, "status") or "completed",
                                     thread_id=self._thread, turn_id=self._turn)]


_P = CodexRolloutParser
_EVENT_HANDLERS: dict[type, Callable[[CodexRolloutParser, Any], list[Event]]] = {
    _TaskStarted: _P._task_started, _TaskComplete: _P._task_complete, _TurnAborted: _P._task_complete,
    _UserMessage: _P._user_message_msg, _AgentMessage: _P._agent_message_msg, _ErrorMsg: _P._error_msg,
    _StreamError: _P._error_msg, _ItemCompleted: _P._item_completed_msg, _ExecBegin: _P._exec_begin,
    _PatchBegin: _P._patch_begin, _McpBegin: _P._mcp_begin, _ExecEnd: _P._exec_end, _PatchEnd: _P._patch_end,
    _McpEnd: _P._mcp_end, _GoalUpdated: _P._goal_updated, _TokenCount: _P._token_count,
    _ThreadNameUpdated: _P._thread_name_updated,
}
_RECORD_HANDLERS: dict[type, Callable[[CodexRolloutParser, Any], list[Event]]] = {
    _SessionMeta: _P._session_meta_record, _TurnContext: _P._turn_context, dict: _P._untyped,
}
_ITEM_HANDLERS: dict[type, Callable[[CodexRolloutParser, Any], list[Event]]] = {
    _FunctionCall: _P._function_call, _LocalShellCall: _P._local_shell_call, _CustomToolCall: _P._custom_tool_call,
    _FunctionCallOutput: _P._function_call_output, _CustomToolCallOutput: _P._function_call_output,
    _WebSearchCall: _P._web_search_call,
}
_BODY_HANDLERS = {**_EVENT_HANDLERS, **_ITEM_HANDLERS}  # the body types of the two are distinct classes


def token_count_usage(payload: dict, *, thread_id: str | None, turn_id: str | None, model: str | None,
                      previous_total: Tokens | None) -> Usage | None:
    """The usage of one ``event_msg`` ``token_count`` body (``{"type": "token_count",
    "info": {total_token_usage, last_token_usage, model_context_window}, …}``), or None
    when it has nothing to count: ``info: null`` (only rate limits changed) or a response
    of no tokens. The response's figures are ``last_token_usage``; a rollout without it
    (older CLIs) gives the rise of ``total_token_usage`` over ``previous_total``, the
    file's total before this record (None: the first). Raises ``UsageRefused`` for a
    figure that cannot be counted (the caller quarantines the record), including a
    total that fell where there is no ``last_token_usage`` to count instead."""
    info = payload.get("info")
    if info is None:
        return None
    if not isinstance(info, dict):
        raise UsageRefused("usage_missing_field", "info", info)
    total = codex_tokens(info.get("total_token_usage"), CODEX_ROLLOUT_NAMES, limit=MAX_TOTAL_TOKENS)
    last = info.get("last_token_usage")
    tokens = (codex_tokens(last, CODEX_ROLLOUT_NAMES) if last is not None
              else difference(total, previous_total or ZERO, "total_token_usage"))
    if tokens.is_zero():
        return None
    window = info.get("model_context_window")
    return Usage(source_kind="codex_rollout", thread_id=thread_id, turn_id=turn_id, tokens=tokens, model=model,
                 total=total, context_window=None if window is None else count(window, "model_context_window"),
                 response_key=codex_response_key(thread_id, total))


#: ``turn_attribution.turn_trigger`` → ``TurnStarted.trigger``: null is a client's ``turn/start``.
_TRIGGERS = {None: "user", "goal": "goal", "queue": "queue"}


def _trigger(attribution) -> str | msgspec.UnsetType:
    """What started the turn, where the rollout says (0.163 and later write
    ``turn_attribution``); a trigger this version does not know reads "unknown"."""
    if attribution is None:
        return msgspec.UNSET
    # Read leniently: the turn's start is worth more than a garbled label on it.
    if not isinstance(attribution, dict) or "turn_trigger" not in attribution:
        return msgspec.UNSET
    trigger = attribution["turn_trigger"]
    return _TRIGGERS.get(trigger, "unknown") if trigger is None or isinstance(trigger, str) else "unknown"


def _seconds_used(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


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
