"""The Codex app-server's wire format for delivery: requests built, replies read into typed values.

The delivery machine (``tillerman.controller.core.delivery``) decides in terms of accepted
turns, queue entries, turn pages and terminals; it never walks JSON. Everything it
needs to know about how the real app-server 0.163.0 spells those things lives here
(reference/codex-app-server.md §2–§4, §1.2, A3):

* **Requests.** One builder per method the delivery protocol and its readbacks send,
  returning ``(method, params)`` for the JSON-RPC client.
* **Replies.** One parser per reply kind, returning a frozen struct that holds only
  the fields the protocol reads. A parser is total: it accepts any JSON value and
  never raises. A field that is missing or has the wrong type reads as absent (``None``,
  ``False``, an empty tuple), and a list entry that is not an object is skipped — the
  machine then sees what it would see of a reply that did not carry the thing (a
  ``{}`` for ``turn/steer`` is an accepted turn with no id; a page with no ``data``
  lists no turns). So one garbled field costs only that field, never the whole reply.
  A wrong *kind* of reply for a command is not a wire matter: the adapter picks the
  parser by command, and the machine refuses a mismatched pair as its own bug.

Turn JSON means the same in a readback and in a live notification: a turn's ``status``
is ``inProgress`` while it runs, and ``completed``, ``interrupted`` or ``failed`` once
it ended; a ``userMessage`` item carries the ``clientUserMessageId`` it was sent with
as ``clientId``. Item ids in ``thread/turns/list`` are the real ones (a resume's
``initialTurnsPage`` uses synthetic ``item-N`` ids), and only ``itemsView: "full"``
lists every item of a turn.
"""

from __future__ import annotations

from typing import Any

import msgspec

Request = tuple[str, dict[str, Any]]

#: A turn's status while it runs (``completed``, ``interrupted``, ``failed`` once ended).
IN_PROGRESS = "inProgress"
#: A loaded thread's status while a turn runs in it (else ``idle``, ``systemError``, ``notLoaded``).
RUNNING = "active"


# -- requests --------------------------------------------------------------------------


def steer(thread_id: str, expected_turn_id: str, client_user_message_id: str, text: str) -> Request:
    """Add a message to the running turn; refused unless ``expected_turn_id`` is the active one."""
    return "turn/steer", {"threadId": thread_id, "expectedTurnId": expected_turn_id,
                          "clientUserMessageId": client_user_message_id, "input": text_input(text)}


def queue_add(thread_id: str, client_user_message_id: str, text: str) -> Request:
    """Queue a message for a turn of its own (the server does not deduplicate by client id)."""
    return "thread/queue/add", {"threadId": thread_id, "clientUserMessageId": client_user_message_id,
                                "input": text_input(text)}


def interrupt(thread_id: str, turn_id: str) -> Request:
    return "turn/interrupt", {"threadId": thread_id, "turnId": turn_id}


def queue_list(thread_id: str) -> Request:
    return "thread/queue/list", {"threadId": thread_id}


def queue_start(thread_id: str) -> Request:
    """Start the head of a paused queue (the rest drains after it)."""
    return "thread/queue/start", {"threadId": thread_id}


def turns_list(thread_id: str, limit: int, *, cursor: str | None = None, full_items: bool = False) -> Request:
    """A page of the thread's turns, newest first. ``full_items``: every item of each turn,
    so every ``userMessage`` and its ``clientId`` (the default view summarizes them)."""
    params: dict[str, Any] = {"threadId": thread_id, "limit": limit}
    if full_items:
        params["itemsView"] = "full"
    return "thread/turns/list", params | ({"cursor": cursor} if cursor else {})


def terminals_list(thread_id: str) -> Request:
    return "thread/backgroundTerminals/list", {"threadId": thread_id}


def terminate(thread_id: str, process_id: str) -> Request:
    return "thread/backgroundTerminals/terminate", {"threadId": thread_id, "processId": process_id}


def thread_resume(thread_id: str) -> Request:
    """Subscribe to the thread's notifications. Its turns are not sent back (a long thread's
    history is megabytes); a page of one shows whether a turn runs now.

    Never for an idle thread: right after the reply the server continues the thread's
    active goal, starting a turn (``emit_resume_goal_snapshot_and_continue`` in Codex's
    app-server; 0.153.4 to 0.171.0 alike, no parameter turns it off). See ``RUNNING``."""
    return "thread/resume", {"threadId": thread_id, "excludeTurns": True, "initialTurnsPage": {"limit": 1}}


def thread_read(thread_id: str) -> Request:
    """What the server knows of a thread (its ``cwd`` and loaded status among it); subscribes
    to nothing and starts nothing."""
    return "thread/read", {"threadId": thread_id}


def goal_get(thread_id: str) -> Request:
    """The thread's goal (``{"goal": null}`` when it has none); starts no turn."""
    return "thread/goal/get", {"threadId": thread_id}


def account_usage_read(thread_id: str) -> Request:
    """The server's estimate of what a thread cost so far (``threadUsage``); needs a
    signed-in account (0.153.4 to 0.171.0 refuse it with -32600 without one)."""
    return "account/usage/read", {"threadId": thread_id}


def goal_pause(thread_id: str, origin: str) -> Request:
    """Pause the thread's goal: Codex starts no continuation turn after the running one.
    Pausing a paused goal changes nothing; a thread with no goal refuses ("no goal exists")."""
    return "thread/goal/set", {"threadId": thread_id, "status": "paused", "origin": origin}


def queue_delete(thread_id: str, queued_submission_id: str) -> Request:
    """Withdraw one queued message; ``{"deleted": false}`` when it is no longer queued."""
    return "thread/queue/delete", {"threadId": thread_id, "queuedSubmissionId": queued_submission_id}


def text_input(text: str) -> list[dict[str, str]]:
    """A user input of one text part, as steer, queue add and turn start take it."""
    return [{"type": "text", "text": text}]


# -- replies -----------------------------------------------------------------------------


class SteerAccepted(msgspec.Struct, frozen=True):
    """``turn/steer`` → ``{"turnId"}``: accepted into that turn, not yet delivered."""

    turn_id: str | None = None


class InterruptAccepted(msgspec.Struct, frozen=True):
    """``turn/interrupt`` → ``{}``: the turn's ``interrupted`` end is the confirmation."""


class QueuedSubmission(msgspec.Struct, frozen=True):
    """``thread/queue/add`` → ``{"queuedSubmission": {"id", …}}``."""

    id: str | None = None


class QueueEntry(msgspec.Struct, frozen=True):
    id: str | None = None
    client_user_message_id: str | None = None


class QueuePage(msgspec.Struct, frozen=True):
    """``thread/queue/list`` → ``{"data": [entry, …], "nextCursor"}``."""

    entries: tuple[QueueEntry, ...] = ()
    readable: bool = True  # False: no ``data`` list, so the reply proves no absence


class TurnItem(msgspec.Struct, frozen=True):
    type: str | None = None  # "userMessage", "agentMessage", "commandExecution", …
    id: str | None = None
    client_id: str | None = None  # a userMessage's clientUserMessageId
    text: str | None = None  # an agentMessage's text


class Turn(msgspec.Struct, frozen=True):
    id: str | None = None
    status: str | None = None  # IN_PROGRESS, or how it ended
    items: tuple[TurnItem, ...] = ()
    # The listing said ``completedAt: null`` (a release without the field says nothing).
    no_end_time: bool = False

    @property
    def running(self) -> bool:
        return self.status == IN_PROGRESS

    @property
    def undecided(self) -> bool:
        """Listed "interrupted" with ``completedAt: null``: Codex 0.171 lists a turn that is
        just starting so for a few milliseconds (46 of 2,152 polls over 40 goal turns, all
        of which then ran), and a turn that died with its server so for good. One listing
        cannot tell which (``tillerman.controller.dispatch.turn_listing`` reads again)."""
        return self.status == "interrupted" and self.no_end_time


class TurnPage(msgspec.Struct, frozen=True):
    """``thread/turns/list`` → ``{"data": [turn, …], "nextCursor"}``, newest turn first."""

    turns: tuple[Turn, ...] = ()
    next_cursor: str | None = None  # None (or empty on the wire): no older page
    readable: bool = True  # False: no ``data`` list, so the reply proves no absence


class Terminal(msgspec.Struct, frozen=True):
    item_id: str | None = None  # the commandExecution item that started the process
    process_id: str | None = None


class TerminalList(msgspec.Struct, frozen=True):
    """``thread/backgroundTerminals/list`` → ``{"data": [terminal, …]}``."""

    terminals: tuple[Terminal, ...] = ()
    readable: bool = True  # False: no ``data`` list, so the reply proves no absence


class Terminated(msgspec.Struct, frozen=True):
    """``thread/backgroundTerminals/terminate`` → ``{"terminated": bool}`` (False: already gone)."""

    terminated: bool = False


class QueueStarted(msgspec.Struct, frozen=True):
    """``thread/queue/start`` → ``{"turn": {"id", …}}``: the turn the queue's head started."""

    turn_id: str | None = None


class Goal(msgspec.Struct, frozen=True):
    """A thread goal as ``thread/goal/set``, ``thread/goal/get`` and ``thread/goal/updated``
    carry it (``{"goal": {threadId, objective, status, tokenBudget, tokensUsed,
    timeUsedSeconds, …}}``; 0.171 sends no ``origin`` back). ``status`` None: no goal."""

    thread_id: str | None = None
    objective: str | None = None
    status: str | None = None
    token_budget: int | None = None
    tokens_used: int | None = None
    time_used_seconds: float | None = None
    origin: str | None = None


class QueueDeleted(msgspec.Struct, frozen=True):
    """``thread/queue/delete`` → ``{"deleted": bool}``: false when the entry was gone already."""

    deleted: bool | None = None


Reply = (SteerAccepted | InterruptAccepted | QueuedSubmission | QueuePage | TurnPage | TerminalList | Terminated
         | QueueStarted | Goal | QueueDeleted)
#: The replies that list what the server holds: absence may be concluded only from a
#: readable one.
Listing = QueuePage | TurnPage | TerminalList


def parse_steer_accepted(result: object) -> SteerAccepted:
    return SteerAccepted(_text(_object(result).get("turnId")))


def parse_interrupt_accepted(result: object) -> InterruptAccepted:
    return InterruptAccepted()


def parse_queued_submission(result: object) -> QueuedSubmission:
    return QueuedSubmission(_text(_object(_object(result).get("queuedSubmission")).get("id")))


def parse_queue_page(result: object) -> QueuePage:
    data = _object(result).get("data")
    return QueuePage(tuple(QueueEntry(_text(entry.get("id")), _text(entry.get("clientUserMessageId")))
                           for entry in _objects(data)), _listed(data))


def parse_turn_page(result: object) -> TurnPage:
    page = _object(result)
    return TurnPage(tuple(_turn(turn) for turn in _objects(page.get("data"))),
                    _text(page.get("nextCursor")) or None, _listed(page.get("data")))


def parse_terminal_list(result: object) -> TerminalList:
    data = _object(result).get("data")
    return TerminalList(tuple(Terminal(_text(terminal.get("itemId")), _process_id(terminal.get("processId")))
                              for terminal in _objects(data)), _listed(data))


def parse_terminated(result: object) -> Terminated:
    return Terminated(_object(result).get("terminated") is True)


def parse_queue_started(result: object) -> QueueStarted:
    return QueueStarted(_text(_object(_object(result).get("turn")).get("id")))


def parse_thread_cwd(result: object) -> str | None:
    """``thread/read`` → ``{"thread": {"cwd", …}}``: the thread's working directory, if named."""
    return _text(_object(_object(result).get("thread")).get("cwd")) or None


def parse_thread_status(result: object) -> str | None:
    """``thread/read`` → ``{"thread": {"status": {"type", …}}}``: ``RUNNING``, ``idle``, …; None
    when the reply does not say."""
    return _text(_object(_object(_object(result).get("thread")).get("status")).get("type"))


def parse_queue_deleted(result: object) -> QueueDeleted:
    deleted = _object(result).get("deleted")
    return QueueDeleted(deleted if isinstance(deleted, bool) else None)


def parse_goal(result: object) -> Goal:
    """``{"goal": {…}}`` (a reply or a ``thread/goal/updated``'s params) → its goal."""
    goal = _object(_object(result).get("goal"))
    return Goal(_text(goal.get("threadId")), _text(goal.get("objective")), _text(goal.get("status")),
                _integer(goal.get("tokenBudget")), _integer(goal.get("tokensUsed")),
                _number(goal.get("timeUsedSeconds")), _text(goal.get("origin")))


def _turn(turn: dict) -> Turn:
    return Turn(_text(turn.get("id")), _text(turn.get("status")),
                tuple(TurnItem(_text(item.get("type")), _text(item.get("id")), _text(item.get("clientId")),
                               _text(item.get("text")))
                      for item in _objects(turn.get("items"))),
                no_end_time="completedAt" in turn and turn["completedAt"] is None)


# -- tolerant field readers: the wrong type reads as absent --------------------------------


def _object(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _listed(data: object) -> bool:
    """A listing is read only when its ``data`` is a list: an absent or garbled one says
    nothing about what the server holds, so nothing may be concluded missing from it."""
    return isinstance(data, list)


def _objects(value: object) -> list[dict]:
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _process_id(value: object) -> str | None:
    """Process ids are strings on the wire; a number names the same process."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _text(value)
