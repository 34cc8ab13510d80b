"""App-server JSON-RPC messages → normalized events, and their natural keys.

Used by the live client (one ``AppServerEvents`` per connection) and by the trace
parser, so the mapping exists once. Only messages from the server are mapped:
notifications, and server→client requests (approvals).

Approval requests are keyed by thread, turn and item id, never by the JSON-RPC
request id, which restarts with the server process. The request id is only
remembered so that ``serverRequest/resolved {requestId}`` can be tied back to
the item it settled; a resolution for a request this stream never showed maps
to nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Union

import msgspec

from tillerman.ledger.events import (
    AgentMessage,
    ApprovalRequested,
    ApprovalResolved,
    Error,
    Event,
    GoalCleared,
    GoalUpdated,
    ItemCompleted,
    ItemStarted,
    NOT_LOADED,
    ModelUsage,
    QueueChanged,
    StatusChanged,
    ThreadNamed,
    ThreadStarted,
    TurnCompleted,
    TurnStarted,
    Usage,
    UsageReported,
    UserMessage,
    kind_of,
)
from tillerman.ledger.command_patterns import DEFAULT, CommandPatterns
from tillerman.ledger.usage import MAX_TOTAL_TOKENS, codex_response_key, codex_tokens, count
from tillerman.monitor.costs import MAX_COST_USD, cost_usd
from tillerman.monitor.codex_wire import Goal, parse_goal, parse_turn_page
from tillerman.monitor.digest import digest, kept_command, payload, size
from tillerman.monitor.lines import TooDeep, nested, valid_utf8
from tillerman.monitor.parser import ack_tokens, git_branch, integer, items, obj, text, workdir

# Server→client requests that make the turn wait for a person, and what they wait for.
APPROVAL_METHODS = {
    "item/commandExecution/requestApproval": "command",
    "item/fileChange/requestApproval": "fileChange",
    "item/permissions/requestApproval": "permissions",
    "item/tool/requestUserInput": "userInput",
}
# Notifications that carry nothing the ledger records.
QUIET_METHODS = frozenset({
    "account/rateLimits/updated", "thread/readState/changed",
    "item/agentMessage/delta", "item/reasoning/summaryTextDelta", "item/reasoning/summaryPartAdded",
    "item/reasoning/textDelta", "item/commandExecution/outputDelta", "item/fileChange/outputDelta",
    "item/mcpToolCall/progress", "turn/diff/updated", "turn/plan/updated",
    "thread/compacted", "account/updated", "mcpServer/oauthLogin/completed", "sessionConfigured",
    "item/updated",
})
_TURN_STATUS = {"completed": "completed", "interrupted": "interrupted", "failed": "failed"}


class _Readers(NamedTuple):
    text: Callable[[Any, str], Any]
    obj: Callable[[Any, str], Any]
    items: Callable[[Any, str], Any]
    integer: Callable[[Any, str], Any]
    value: Callable[[Any, str], Any]  # any JSON value, checked by whoever reads it


def _value(record: dict, key: str) -> Any:
    return record.get(key)


_CHECKED = _Readers(text, obj, items, integer, _value)  # a dict: each field's type checked as it is read (WrongType)
_DECLARED = _Readers(getattr, getattr, getattr, getattr, getattr)  # a typed Struct: checked by its decode


class AppServerEvents:
    """The stateful mapping for one server connection (or one trace)."""

    def __init__(self, *, patterns: CommandPatterns = DEFAULT, retain_payloads: bool = False) -> None:
        self.patterns = patterns
        self.retain_payloads = retain_payloads
        # JSON-RPC request id (with its type: 1 and "1" differ) → the approval it asked.
        self._requests: dict[tuple[type, Any], ApprovalRequested] = {}
        # thread id → the model its responses come from: a token usage notification names
        # none, so it is learned from what does (a resume's reply, a settings change, a reroute).
        self._models: dict[str, str] = {}

    def knows(self, method: str) -> bool:
        return method in _HANDLERS or method in APPROVAL_METHODS or method in QUIET_METHODS

    def normalize(self, msg: dict) -> list[Event]:
        """Events for one message from the server ([] for responses and quiet notifications).

        Raises ``WrongType`` (or a TypeError/AttributeError) on a malformed message;
        callers reading foreign input quarantine it.
        """
        method = text(msg, "method")
        if method is None:
            return []  # a response: see ``response``
        params = obj(msg, "params")
        if method in APPROVAL_METHODS:
            return self._approval(msg.get("id"), params, APPROVAL_METHODS[method])
        handler = _HANDLERS.get(method)
        return handler(self, params) if handler else []

    def typed(self, message: HotNotification) -> list[Event]:
        """Events for one notification ``decode_hot`` decoded: what ``normalize`` gives
        for the same frame."""
        handler = _HANDLERS.get(message.method)
        return handler(self, message.params, _DECLARED) if handler else []

    def response(self, method: str, result: dict) -> list[Event]:
        """Events in the result of one of the client's requests.

        ``thread/resume`` is how a supervisor that attaches late learns of the
        turn already running (its ``turn/started`` went by before it subscribed);
        ``thread/read`` tells it what a thread it did not see start is (the user's
        work, or one of Codex's ephemeral housekeeping threads). ``thread/goal/get``
        and ``thread/goal/set`` answer with the thread's goal (a set is tillerman's own
        change: ``by="tillerman"``).
        """
        if method == "thread/read":
            return self._thread_started(result)
        if method in ("thread/start", "thread/resume"):
            self._learn_model(text(obj(result, "thread"), "id"), text(result, "model"))
        if method in ("thread/goal/get", "thread/goal/set"):
            return self._goal(parse_goal(result), None, by="tillerman" if method == "thread/goal/set" else None)
        if method != "thread/resume":
            return []
        thread_id = text(obj(result, "thread"), "id")
        page = parse_turn_page(result.get("initialTurnsPage"))
        # A running turn whose id is missing or garbled names nothing to follow.
        return [TurnStarted(thread_id=thread_id, turn_id=turn.id) for turn in page.turns
                if turn.running and turn.id is not None]

    def account_usage(self, result: dict, turn_id: str | None) -> list[Event]:
        """``account/usage/read`` for one thread, asked at the end of ``turn_id``: the
        server's own estimate of what the thread cost so far (``estimatedUsageUsdMicros``,
        as dollars; null: unknown, never 0) and its per-model groups, kept beside our
        figures and never added to them. No ``threadUsage`` (no billing route): nothing.
        A group naming no model, or without input and output figures, is not listed: its
        tokens are unknown, not 0. A bad figure raises ``UsageRefused``."""
        usage = obj(result, "threadUsage")
        if not usage:
            return []
        micros = usage.get("estimatedUsageUsdMicros")
        dollars = None if micros is None else count(micros, "estimatedUsageUsdMicros",
                                                     limit=int(MAX_COST_USD * 1_000_000)) / 1_000_000
        models = tuple(ModelUsage(model=group["model"], tokens=codex_tokens(group, limit=MAX_TOTAL_TOKENS))
                       for group in items(usage, "groups") if isinstance(group, dict)
                       and isinstance(group.get("model"), str)
                       and group.get("inputTokens") is not None and group.get("outputTokens") is not None)
        return [UsageReported(source_kind="codex_account", thread_id=text(usage, "threadId"), turn_id=turn_id,
                              cost_usd=cost_usd(dollars, "estimatedUsageUsdMicros"), models=models)]

    # -- handlers ------------------------------------------------------------------

    def _thread_started(self, params: dict) -> list[Event]:
        """A thread's start (or ``thread/read``'s answer), and its name where it has one
        (``name``: a thread named before tillerman saw it)."""
        thread = obj(params, "thread")
        name = text(thread, "name")
        named = [ThreadNamed.of(text(thread, "id"), name)] if name else []
        return [ThreadStarted(thread_id=text(thread, "id"), parent_thread_id=text(thread, "parentThreadId"),
                              cli_version=text(thread, "cliVersion"), source_format="appserver",
                              ephemeral=thread.get("ephemeral") is True, thread_source=text(thread, "threadSource"),
                              **workdir(text(thread, "cwd"), retain=self.retain_payloads,
                                        branch=git_branch(thread.get("gitInfo")))), *named]

    # The hot handlers read through ``r``: the checking readers for a dict, ``getattr``
    # for the typed Structs below (whose decode already checked every field they read).

    def _status(self, params, r: _Readers = _CHECKED) -> list[Event]:
        status = r.obj(params, "status")
        flags = tuple(str(flag) for flag in r.items(status, "activeFlags"))
        return [StatusChanged(thread_id=r.text(params, "threadId"), status=r.text(status, "type") or "unknown",
                              flags=flags)]

    def _turn_started(self, params, r: _Readers = _CHECKED) -> list[Event]:
        return [TurnStarted(thread_id=r.text(params, "threadId"), turn_id=r.text(r.obj(params, "turn"), "id"))]

    def _turn_completed(self, params, r: _Readers = _CHECKED) -> list[Event]:
        turn = r.obj(params, "turn")
        return [TurnCompleted(thread_id=r.text(params, "threadId"), turn_id=r.text(turn, "id"),
                              status=_TURN_STATUS.get(r.text(turn, "status") or "", "failed"),
                              duration_ms=r.integer(turn, "durationMs"))]

    def _item_started(self, params, r: _Readers = _CHECKED) -> list[Event]:
        return self._item(params, False, r)

    def _item_completed(self, params, r: _Readers = _CHECKED) -> list[Event]:
        return self._item(params, True, r)

    def _item(self, params, completed: bool, r: _Readers) -> list[Event]:
        item = r.obj(params, "item")
        ids = {"thread_id": r.text(params, "threadId"), "turn_id": r.text(params, "turnId")}
        item_type = r.text(item, "type") or "unknown"
        item_id = r.text(item, "id") or ""
        if item_type == "userMessage":
            if not completed:
                return []  # started and completed carry the same input: record it once
            said = _input_text(r.items(item, "content"))
            p = payload(said, retain=self.retain_payloads)
            return [UserMessage(digest=p.digest, size=p.size, text=p.text, client_id=r.text(item, "clientId"),
                                item_id=item_id, **ids)]
        if item_type == "agentMessage":
            if not completed:
                return []  # a message abandoned by a steer never completes
            said = r.text(item, "text") or ""
            p = payload(said, retain=self.retain_payloads)
            return [AgentMessage(digest=p.digest, size=p.size, text=p.text, item_id=item_id,
                                 ack_tokens=ack_tokens(said), **ids)]
        if item_type == "reasoning":
            return []
        command = r.text(item, "command")
        critical, external = self.patterns.classify(command) if command else (False, False)
        common = dict(item_id=item_id, item_type=item_type, critical=critical, external=external,
                      args_digest=digest(command) if command else None, **ids)
        if not completed:
            return [ItemStarted(command=kept_command(command, retain=self.retain_payloads), **common)]
        output = r.text(item, "aggregatedOutput")
        return [ItemCompleted(status=r.text(item, "status") or "completed", exit_code=r.integer(item, "exitCode"),
                              output_digest=digest(output) if output is not None else None,
                              output_size=size(output) if output is not None else None, **common)]

    def _approval(self, request_id: Any, params: dict, approval_kind: str) -> list[Event]:
        event = ApprovalRequested(thread_id=text(params, "threadId"), turn_id=text(params, "turnId"),
                                  item_id=text(params, "itemId") or "", approval_kind=approval_kind)
        if isinstance(request_id, (int, str)) and not isinstance(request_id, bool):
            self._requests[(type(request_id), request_id)] = event
        return [event]

    def _resolved(self, params: dict) -> list[Event]:
        request_id = params.get("requestId")
        if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
            return []
        asked = self._requests.pop((type(request_id), request_id), None)
        if asked is None:
            return []
        return [ApprovalResolved(thread_id=asked.thread_id, turn_id=asked.turn_id, item_id=asked.item_id)]

    def _goal_updated(self, params: dict) -> list[Event]:
        goal = parse_goal(params)
        return self._goal(goal, text(params, "turnId"), thread_id=text(params, "threadId") or goal.thread_id)

    def _goal(self, goal: Goal, turn_id: str | None, *, thread_id: str | None = None,
              by: str | None = None) -> list[Event]:
        """A goal as the server reported it; a reply that holds none (``{"goal": null}``)
        records nothing: whether the thread had one before is not known from it."""
        if goal.status is None:
            return []
        objective = payload(goal.objective, retain=self.retain_payloads) if goal.objective is not None else None
        return [GoalUpdated(thread_id=thread_id or goal.thread_id, turn_id=turn_id, status=goal.status,
                            objective_digest=objective.digest if objective else None,
                            objective=objective.text if objective else None, origin=goal.origin,
                            token_budget=goal.token_budget, tokens_used=goal.tokens_used,
                            time_used_seconds=goal.time_used_seconds, by=by)]

    def _named(self, params: dict) -> list[Event]:
        """``thread/name/updated {threadId, threadName?}``: the name a client set
        (``thread/name/set``) or Codex gave the thread; no ``threadName``: cleared."""
        return [ThreadNamed.of(text(params, "threadId"), text(params, "threadName"))]

    def _closed(self, params: dict) -> list[Event]:
        """``thread/closed {threadId}``: the server unloaded the thread (no subscriber
        left, or shut down), after which it reports it ``notLoaded``: its session ended
        until a ``thread/resume`` loads it again."""
        return [StatusChanged(thread_id=text(params, "threadId"), status=NOT_LOADED)]

    def _goal_cleared(self, params: dict) -> list[Event]:
        return [GoalCleared(thread_id=text(params, "threadId"))]

    def _queue_changed(self, params: dict) -> list[Event]:
        # The server says only "changed"; the contents need a thread/queue/list.
        return [QueueChanged(thread_id=text(params, "threadId"), known=False)]

    def _token_usage(self, params, r: _Readers = _CHECKED) -> list[Event]:
        """One response's usage (``last``) with the thread's running total after it
        (``total``); a figure ``codex_tokens`` refuses raises ``UsageRefused``, which the
        tap quarantines with its reason. A breakdown without ``inputTokens`` and
        ``outputTokens`` is refused as missing: a bare ``totalTokens`` cannot be split."""
        usage = r.obj(params, "tokenUsage")
        thread_id = r.text(params, "threadId")
        total = codex_tokens(r.value(usage, "total"), limit=MAX_TOTAL_TOKENS)
        tokens = codex_tokens(r.value(usage, "last"))
        if tokens.is_zero():
            return []
        window = r.value(usage, "modelContextWindow")
        return [Usage(source_kind="codex_live", thread_id=thread_id, turn_id=r.text(params, "turnId"), tokens=tokens,
                      total=total, model=self._models.get(thread_id) if thread_id else None,
                      context_window=None if window is None else count(window, "modelContextWindow"),
                      response_key=codex_response_key(thread_id, total))]

    def _settings_updated(self, params: dict) -> list[Event]:
        self._learn_model(text(params, "threadId"), text(obj(params, "threadSettings"), "model"))
        return []

    def _model_rerouted(self, params: dict) -> list[Event]:
        self._learn_model(text(params, "threadId"), text(params, "toModel"))
        return []

    def _learn_model(self, thread_id: str | None, model: str | None) -> None:
        if thread_id and model:
            self._models[thread_id] = model

    def _error(self, params: dict) -> list[Event]:
        error = obj(params, "error")
        info = error.get("codexErrorInfo")
        return [Error(thread_id=text(params, "threadId"), turn_id=text(params, "turnId"),
                      message_digest=digest(text(error, "message") or ""),
                      will_retry=params.get("willRetry") is True, code=info if isinstance(info, str) else None)]


_HANDLERS = {
    "thread/started": AppServerEvents._thread_started,
    "thread/status/changed": AppServerEvents._status,
    "thread/name/updated": AppServerEvents._named,
    "thread/closed": AppServerEvents._closed,
    "turn/started": AppServerEvents._turn_started,
    "turn/completed": AppServerEvents._turn_completed,
    "item/started": AppServerEvents._item_started,
    "item/completed": AppServerEvents._item_completed,
    "serverRequest/resolved": AppServerEvents._resolved,
    "thread/queue/changed": AppServerEvents._queue_changed,
    "thread/goal/updated": AppServerEvents._goal_updated,
    "thread/goal/cleared": AppServerEvents._goal_cleared,
    "thread/tokenUsage/updated": AppServerEvents._token_usage,
    "thread/settings/updated": AppServerEvents._settings_updated,
    "model/rerouted": AppServerEvents._model_rerouted,
    "error": AppServerEvents._error,
}


# -- typed decoding of the notifications that make up the flood ---------------------
#
# A busy server sends tens of notifications per thread and second, most of them deltas
# and token counts that the ledger never records. These Structs declare exactly the
# fields the handlers above read, each with the types their checking readers accept
# (stricter where that is simpler: a null object), so a frame that fits them maps to
# the same events as its dict; anything else (a response, an approval request, an
# unknown method, a field of another shape) is decoded as a dict as before.


class _Params(msgspec.Struct):
    startedAtMs: Any = None  # the tap's time stamp when the message has no emittedAtMs


class _Status(msgspec.Struct):
    type: str | None = None
    activeFlags: list = []


class _StatusParams(_Params):
    threadId: str | None = None
    status: _Status = msgspec.field(default_factory=_Status)


class _Turn(msgspec.Struct):
    id: str | None = None
    status: str | None = None
    durationMs: int | None = None


class _TurnParams(_Params):
    threadId: str | None = None
    turn: _Turn = msgspec.field(default_factory=_Turn)


class _Item(msgspec.Struct):
    type: str | None = None
    id: str | None = None
    content: list = []
    clientId: str | None = None
    text: str | None = None
    command: str | None = None
    aggregatedOutput: str | None = None
    status: str | None = None
    exitCode: int | None = None


class _ItemParams(_Params):
    threadId: str | None = None
    turnId: str | None = None
    item: _Item = msgspec.field(default_factory=_Item)


class _TokenUsage(msgspec.Struct):
    total: Any = None  # the breakdowns and the window are checked by codex_tokens and count
    last: Any = None
    modelContextWindow: Any = None


class _TokenUsageParams(_Params):
    threadId: str | None = None
    turnId: str | None = None
    tokenUsage: _TokenUsage = msgspec.field(default_factory=_TokenUsage)


class HotNotification(msgspec.Struct, tag_field="method"):
    """A notification ``decode_hot`` took; ``method`` is its tag."""

    emittedAtMs: Any = msgspec.UNSET
    id: Any = msgspec.UNSET  # a server request: not a notification, decoded as a dict

    @property
    def method(self) -> str:
        return self.__struct_config__.tag  # type: ignore[return-value]


def _notification(method: str, params: type) -> type:
    return msgspec.defstruct(f"Hot_{method}", [("params", params, msgspec.field(default_factory=params))],
                             bases=(HotNotification,), tag=method)


_HOT_PARAMS = {"thread/status/changed": _StatusParams, "turn/started": _TurnParams, "turn/completed": _TurnParams,
               "item/started": _ItemParams, "item/completed": _ItemParams,
               "thread/tokenUsage/updated": _TokenUsageParams}
# Quiet ones: their params are only checked to be an object, as ``RpcSession`` does.
_HOT = msgspec.json.Decoder(Union[tuple(_notification(method, params) for method, params in  # noqa: UP007
                                        [*_HOT_PARAMS.items(), *((m, _Params) for m in sorted(QUIET_METHODS))])])


def decode_hot(frame: str | bytes) -> HotNotification | None:
    """The frame as a typed notification, or None: decode it as a dict (``RpcSession``).

    Fields no handler reads are skipped, as a Codex rollout's are (``TypedLines``): they
    must be valid JSON (msgspec checks the syntax while skipping) in valid UTF-8 (a text
    frame is, the WebSocket layer checked it; a binary one is checked here), but their
    numbers' range and their depth are not checked, since they never become values. The
    values that are read are refused as a plain decode refuses them: a number beyond a
    double fails the typed decode, and an object or array read whole is checked for
    depth (``nested``). Skipping nesting so deep that it passes Python's recursion limit
    fails too, and is left to the dict path (which refuses it as too deep)."""
    if frame.__class__ is bytes and not (frame.isascii() or valid_utf8(frame)):  # type: ignore[union-attr]
        return None
    try:
        message = _HOT.decode(frame)
    except (msgspec.DecodeError, RecursionError):
        return None
    if message.id is not msgspec.UNSET:
        return None
    params = message.params
    try:
        nested(message.emittedAtMs, 2)
        nested(params.startedAtMs, 3)
        if params.__class__ is _ItemParams:
            nested(params.item.content, 4)
        elif params.__class__ is _StatusParams:
            nested(params.status.activeFlags, 4)
        elif params.__class__ is _TokenUsageParams:
            nested(params.tokenUsage.total, 4)
            nested(params.tokenUsage.last, 4)
    except TooDeep:
        return None
    return message


def _input_text(content: list) -> str:
    """The text of a user input (``[{"type": "text", "text": …}, …]``)."""
    return "\n".join(part["text"] for part in content
                     if isinstance(part, dict) and isinstance(part.get("text"), str))


# -- natural keys ------------------------------------------------------------------

# Kinds whose fields identify one fact; the others (a status change, a queue hint,
# an error) can repeat with identical fields, so the caller adds a discriminator.
_IDENTIFIED = frozenset({"thread_started", "turn_started", "turn_completed", "item_started", "item_completed",
                         "approval_requested", "approval_resolved", "usage"})
_encode = msgspec.json.Encoder().encode


def natural_key(event: Event, discriminator: str | int | float | None = None) -> str:
    """A stable key for an app-server fact: kind, thread, turn, item id, status.

    Approvals are keyed by thread, turn and item (not the request id), so a
    request re-sent on resume, or seen by a restarted supervisor, keeps its key.
    For kinds without an identity of their own (status_changed, queue_changed,
    error, and messages without an item id) pass a ``discriminator`` such as the
    notification's ``emittedAtMs``; without one, equal facts share a key.
    """
    kind = kind_of(event)
    item_id = getattr(event, "item_id", None)
    status: str | None = getattr(event, "status", None)
    if kind == "status_changed":
        status = ",".join((event.status, *event.flags))  # type: ignore[attr-defined]
    elif kind == "usage":  # one response: the thread's running total after it tells it apart
        total = event.total  # type: ignore[attr-defined]
        status = None if total is None else str(total.total)
    parts: list = [kind, event.thread_id, event.turn_id, item_id, status]
    if kind not in _IDENTIFIED and not (item_id and kind in ("user_message", "agent_message")):
        parts.append(discriminator)
    return _encode(parts).decode()
