"""The relay state of ``tillerman claude``, without I/O: what the wrapper between a
harness and the Claude Code CLI (stream-json in and out) knows about the session,
and the lines tillerman itself writes to the CLI.

It is told every line the harness sends (``from_harness``) and every line the CLI
writes with the events the stream-json parser read from it (``from_cli``), and says:

* whether a CLI line goes on to the harness: everything does, byte for byte, except
  the answers to tillerman's own messages (the ``control_response`` to its request
  ids, the ``command_lifecycle`` lines and ``--replay-user-messages`` echoes of its
  message uuids);
* the CLI's own evidence that a message of ours reached the model (``Echo``): the
  ``command_lifecycle`` ``started`` while a turn runs (folded into that turn at its
  tool round), a turn's ``system/init`` or ``result`` listing the uuid in
  ``user_message_uuids`` (it opened that turn). Never the write itself;
* the answers to our control requests, by request id;
* our steers still queued when the turn they were meant for ended: the CLI would run
  them as the next turn, so they are withdrawn (``cancel_async_message``), never
  injected there.

A steer goes out only while a tool call of its turn runs (``steer_ready``): the CLI
folds a queued message in right after a tool result, so a steer sent then lands in
that turn; one sent while the model writes its last answer would become the next turn.

Our messages carry a uuid derived from the intent's client id (``message_uuid``), so a
restarted wrapper recognizes them in the transcript; our request ids carry a prefix
and a counter, and skip any id the harness has used.

The relay is a pipe first: whatever the CLI prints reaches the harness. Every field it
reads from a CLI line may hold any JSON value (``_text`` takes a string, nothing else,
so an id of another type is simply not one of ours), and a line too long to hold
(``CliFramer``) goes on in pieces as it arrives, never decided on: no line of ours is
that long. What the CLI wrote that tillerman cannot read is the stream-json parser's to
quarantine.
"""

from __future__ import annotations

import json
import uuid as uuids
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from tillerman.ledger.events import Event, ItemCompleted, ItemStarted, TurnCompleted, TurnStarted
from tillerman.monitor.lines import MAX_LINE, decode_json

#: The uuid namespace of tillerman's messages (``message_uuid``).
_NAMESPACE = uuids.UUID("6f1d2c3e-7a4b-5c6d-8e9f-0a1b2c3d4e5f")
REQUEST_PREFIX = "tillerman-req-"


def message_uuid(client_id: str) -> str:
    """The uuid tillerman sends a message with: the same for the same intent, in any process."""
    return str(uuids.uuid5(_NAMESPACE, client_id))


@dataclass
class Ours:
    """A message tillerman wrote to the CLI."""

    uuid: str
    client_id: str
    intent_id: str
    # a steer's turn, under every id the session's sources give it (the relay knows it by
    # stream-json's, the intent may by the hooks' prompt_id); empty for a queued message
    expected_turns: tuple[str, ...]
    state: str = "sent"  # sent | queued | started | cancelled | completed


@dataclass(frozen=True)
class Echo:
    """The CLI's evidence that our message reached the model in ``turn_id``."""

    uuid: str
    client_id: str
    intent_id: str
    turn_id: str | None
    via: str  # command_lifecycle | system_init | result


@dataclass(frozen=True)
class FromCli:
    forward: bool
    echoes: tuple[Echo, ...] = ()
    answers: tuple[tuple[str, dict[str, Any]], ...] = ()  # (our request id, the control_response's response)
    accepted: tuple[str, ...] = ()  # our message uuids the CLI acknowledged (queued or started)
    withdraw: tuple[Ours, ...] = ()  # our steers still queued when their turn ended
    cancelled: tuple[Ours, ...] = ()  # ours the CLI dropped before they ran (withdrawn, or cleared by an interrupt)


@dataclass
class Relay:
    turn: str | None = None  # the running turn (the parser's id for it)
    tools: dict[str, str | None] = field(default_factory=dict)  # running tool call -> its turn
    ours: dict[str, Ours] = field(default_factory=dict)  # message uuid -> ours
    requests: dict[str, str] = field(default_factory=dict)  # our request id -> its subtype
    harness_request_ids: set[str] = field(default_factory=set)
    _echoed: set[str] = field(default_factory=set)
    _counter: int = 0

    # -- the harness's side -------------------------------------------------------

    def from_harness(self, raw: bytes) -> None:
        """Learn the request ids the harness uses (ours must never equal one)."""
        record = cli_record(raw)
        request_id = _text(record.get("request_id"))
        if record.get("type") == "control_request" and request_id is not None:
            self.harness_request_ids.add(request_id)

    # -- the CLI's side -----------------------------------------------------------

    def from_cli(self, raw: bytes, events: list[Event]) -> FromCli:
        record = cli_record(raw)
        kind = record.get("type")
        echoes: list[Echo] = []
        withdraw: list[Ours] = []
        if kind == "result":  # the uuids it answered, before the end moves the turn on
            echoes += self._listed(record, self.turn, "result")
        for event in events:
            withdraw += self._apply(event)
        if kind == "system" and record.get("subtype") == "init":
            echoes += self._listed(record, self.turn, "system_init")
        if kind == "command_lifecycle":
            return self._lifecycle(record)
        if kind == "control_response":
            response = record.get("response") if isinstance(record.get("response"), dict) else {}
            request_id = _text(response.get("request_id"))
            if request_id is not None and request_id in self.requests:
                self.requests.pop(request_id)
                return FromCli(False, answers=((request_id, response),))
        if kind == "user" and record.get("isReplay") and _text(record.get("uuid")) in self.ours:
            return FromCli(False)
        return FromCli(True, tuple(echoes), withdraw=tuple(withdraw))

    def _apply(self, event: Event) -> list[Ours]:
        match event:
            case TurnStarted():
                self.turn = event.turn_id
            case TurnCompleted():
                if event.turn_id == self.turn:
                    self.turn = None
                self.tools = {k: t for k, t in self.tools.items() if t != event.turn_id}
                return [o for o in self.ours.values() if o.state == "queued" and event.turn_id in o.expected_turns]
            case ItemStarted():
                self.tools[event.item_id] = event.turn_id
            case ItemCompleted():
                self.tools.pop(event.item_id, None)
        return []

    def _lifecycle(self, record: dict) -> FromCli:
        ours = self.ours.get(_text(record.get("command_uuid")) or "")
        if ours is None:
            return FromCli(True)
        state = record.get("state")
        accepted = (ours.uuid,) if state in ("queued", "started") and ours.state == "sent" else ()
        cancelled = (ours,) if state == "cancelled" and ours.state in ("sent", "queued") else ()
        if isinstance(state, str):
            ours.state = state
        echoes = ()
        if state == "started" and self.turn is not None:
            echoes = self._echo(ours, self.turn, "command_lifecycle")  # folded into the running turn
        return FromCli(False, echoes, accepted=accepted, cancelled=cancelled)

    def _listed(self, record: dict, turn: str | None, via: str) -> list[Echo]:
        listed = record.get("user_message_uuids")
        found: list[Echo] = []
        for uuid in listed if isinstance(listed, list) else ():
            ours = self.ours.get(_text(uuid) or "")
            if ours is not None:
                found += self._echo(ours, turn, via)
        return found

    def _echo(self, ours: Ours, turn: str | None, via: str) -> tuple[Echo, ...]:
        if ours.uuid in self._echoed:
            return ()
        self._echoed.add(ours.uuid)
        return (Echo(ours.uuid, ours.client_id, ours.intent_id, turn, via),)

    # -- what tillerman writes ----------------------------------------------------

    def steer_ready(self, turn_ids: tuple[str, ...]) -> bool:
        """A steer for the turn ``turn_ids`` name (every source's id of it) may go now: that
        turn runs a tool call, so the CLI folds the message in at its result."""
        return self.running(turn_ids) and self.turn in self.tools.values()

    def running(self, turn_ids: tuple[str, ...]) -> bool:
        """Whether the turn ``turn_ids`` name is the one running."""
        return self.turn is not None and self.turn in turn_ids

    def queued(self) -> list[Ours]:
        return [o for o in self.ours.values() if o.state == "queued"]

    def message(self, client_id: str, intent_id: str, text: str, *, expected_turns: tuple[str, ...],
                priority: str | None) -> tuple[Ours, bytes]:
        """A user message of ours, and the line that sends it."""
        ours = Ours(message_uuid(client_id), client_id, intent_id, expected_turns)
        self.ours[ours.uuid] = ours
        line: dict[str, Any] = {"type": "user", "message": {"role": "user", "content": text},
                                "parent_tool_use_id": None, "session_id": "", "uuid": ours.uuid}
        if priority is not None:
            line["priority"] = priority
        return ours, _line(line)

    def control(self, subtype: str, **fields: Any) -> tuple[str, bytes]:
        """A control request of ours, and the line that sends it."""
        while True:
            self._counter += 1
            request_id = f"{REQUEST_PREFIX}{self._counter}"
            if request_id not in self.harness_request_ids:
                break
        self.requests[request_id] = subtype
        return request_id, _line({"type": "control_request", "request_id": request_id,
                                  "request": {"subtype": subtype, **fields}})


class Piece(NamedTuple):
    """Bytes of the CLI's stdout, in order: a ``whole`` line (its newline included) for
    the relay to decide on, or a piece of a line too long to hold, which goes straight on."""

    data: bytes
    whole: bool


class CliFramer:
    """The CLI's stdout cut into pieces. A line whose body fits ``max_line`` bytes is held
    until its newline arrives; a longer one is passed on as it arrives, so what is
    held stays under ``max_line`` plus one chunk, whatever the CLI prints. ``max_line`` is
    the stream-json parser's, so the lines held whole are the lines it reads, and the
    ones passed on are the ones it quarantines as too long."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._held = bytearray()
        self._passing = False  # inside a line too long to hold

    def feed(self, data: bytes) -> list[Piece]:
        pieces: list[Piece] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline + 1
            chunk = data[start:end]
            body = len(self._held) + len(chunk) - (newline >= 0)
            if self._passing or body > self.max_line:
                pieces.append(Piece(bytes(self._held) + chunk, False))
                self._held.clear()
                self._passing = newline < 0
            elif newline >= 0:
                pieces.append(Piece(bytes(self._held) + chunk, True))
                self._held.clear()
            else:
                self._held += chunk
            start = end
        return pieces

    def close(self) -> bytes | None:
        """The end of the output: a last line without its newline, if one is held."""
        if not self._held:
            return None
        last = bytes(self._held)
        self._held.clear()
        return last


def cli_record(raw: bytes) -> dict[str, Any]:
    """A CLI line's JSON object; empty when it is none (not JSON, not an object, nested
    too deep, not UTF-8): such a line is the harness's to make sense of."""
    try:
        record = decode_json(raw)
    except msgspec.DecodeError:
        return {}
    return record if isinstance(record, dict) else {}


def _text(value: Any) -> str | None:
    """A field read from a CLI line, when it is a string: ids of any other type are no
    ids of ours (and a list or an object would not even look one up)."""
    return value if isinstance(value, str) else None


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"
