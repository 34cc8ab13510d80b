"""The interface every format parser shares, and the plumbing they all reuse.

A parser is sans-IO: bytes go in through ``feed()``, ``Parsed`` events come out;
files, sockets and clocks belong to the drivers. One parser reads one stream.
Bad input never raises: a line that cannot be read, or whose fields have the
wrong types, becomes a ``Quarantined`` event with its byte range and reason.
Record types a parser does not know are counted in ``unknown_types``.

A subclass implements ``_events(record)`` (and ``_time(record)`` when its format
has timestamps; or ``_stamp``, which only reads the time and checks its type, and
``_seconds``, which converts it, asked only for records that have events). Helpers ``text``/``obj``/``items`` read a field and raise
``WrongType`` when it has the wrong type, which quarantines the whole record
(``as_text``/``as_obj``/``as_integer`` check a value already read, such as a Struct's
field). A format whose records are read into msgspec Structs sets ``lines``
(``TypedLines``); its ``_events`` then gets the Struct, or the plain dict of a record
outside its Structs.
"""

from __future__ import annotations

import collections
import re
from datetime import datetime, timezone
from pathlib import PurePath
from typing import Any, ClassVar, NamedTuple

import msgspec

from tillerman.ledger.events import AgentMessage, AnyEvent, Event, ItemCompleted, ItemStarted, Quarantined, UserMessage
from tillerman.ledger.command_patterns import DEFAULT, CommandPatterns
from tillerman.ledger.usage import UsageRefused
from tillerman.monitor.digest import digest, kept_command, measure, payload
from tillerman.monitor.lines import (
    MAX_LINE,
    TOO_DEEP,
    WRONG_TYPE,
    Line,
    LineFramer,
    Skipped,
    TooDeep,
    TypedLines,
    decode_record,
)


class Parsed(msgspec.Struct, frozen=True, array_like=True):
    """An event of a record, where it came from; an array on a pipe (``ForkedFileReader``)."""

    event: AnyEvent
    offset: int  # byte offset of the source record
    length: int  # byte length of the record, newline included
    index: int  # position among the events derived from the same record
    at: float | None  # source time (epoch seconds UTC); None when the format has none


class WrongType(Exception):
    """A field of an otherwise valid record has a type the format never uses."""


_INTENT_ID = re.compile(r"\bin-[0-9a-f]{20}\b")
# Source times a ledger can store and a person can read: years 1 to 9999 (datetime's range).
EARLIEST = datetime.min.replace(tzinfo=timezone.utc).timestamp()
LATEST = datetime.max.replace(tzinfo=timezone.utc).timestamp()


def ack_tokens(text: str) -> tuple[str, ...]:
    """Every intent id the text mentions, in order, without repeats."""
    if "in-" not in text:  # the common case, found without the regular expression
        return ()
    return tuple(dict.fromkeys(_INTENT_ID.findall(text)))


def workdir(path: str | None, *, retain: bool, branch: Any = None) -> dict[str, str | None]:
    """A session's working directory as ``ThreadStarted`` fields: its digest always, the
    path itself only when payloads are retained (a path can name a customer or a person);
    its last part (the project) and the git ``branch`` always, where known: what a person
    knows a session by on the dashboard, far less telling than the path. A branch that is
    not a name is left out, never a reason to refuse the line that starts the session."""
    fields: dict[str, str | None] = {}
    if isinstance(branch, str) and branch:
        fields["git_branch"] = branch
    if not path:
        return fields
    project = PurePath(path).name or None
    return {"cwd_digest": digest(path), "cwd": path if retain else None, "project": project, **fields}


def git_branch(git: Any) -> Any:
    """The branch of a Codex ``git`` / ``gitInfo`` object (``workdir`` checks it is a name)."""
    return git.get("branch") if isinstance(git, dict) else None


class Parser:
    format: ClassVar[str]
    untimed: ClassVar[bool] = False  # the format carries no source times: ``at`` is always None
    lines: ClassVar[TypedLines | None] = None  # the format's Structs; None: every record is a dict

    def __init__(
        self,
        source: str,
        *,
        patterns: CommandPatterns = DEFAULT,
        retain_payloads: bool = False,
        max_line: int = MAX_LINE,
    ) -> None:
        self.source = source
        self.patterns = patterns
        self.retain_payloads = retain_payloads
        self.records = 0
        self.unknown_types: collections.Counter[str] = collections.Counter()
        self._framer = LineFramer(max_line)
        # Byte offset of the record being read: a stable id where the format has none.
        self._offset = 0

    def use_patterns(self, patterns: CommandPatterns) -> None:
        """Classify commands with these patterns from now on (a reloaded configuration)."""
        self.patterns = patterns

    def feed(self, data: bytes) -> list[Parsed]:
        offset = self._framer.consumed
        frames = self._framer.split(data)
        return self._parse(frames, offset, self._framer.ascii)

    def close(self) -> list[Parsed]:
        tail = self._framer.close()
        return self._parse(tail, tail[0].offset, False) if tail else []

    @property
    def consumed(self) -> int:
        """Bytes fed whose records are all accounted for (a partial last line is not)."""
        return self._framer.consumed

    # -- plumbing ------------------------------------------------------------

    def _parse(self, frames: list[bytes | Line | Skipped], offset: int, ascii: bool) -> list[Parsed]:
        """Events of ``frames`` (line bodies, an unterminated tail, skipped ranges) whose
        first starts at ``offset``; ``ascii``: every body is known to be ASCII."""
        out: list[Parsed] = []
        typed = self.lines.decode if self.lines is not None else None
        stamp, seconds, handle = self._stamp, self._seconds, self._events
        blank = 0
        for frame in frames:
            at = offset
            if frame.__class__ is bytes:
                length = len(frame) + 1
                offset += length
                record = typed(frame, True, ascii) if typed is not None else decode_record(frame)
            elif isinstance(frame, Skipped):
                out.append(self._quarantine(frame.offset, frame.length, frame.reason))
                offset += frame.length
                continue
            else:  # the unterminated tail
                length = frame.length
                offset += length
                record = (typed(frame.data, False, False) if typed is not None
                          else decode_record(frame.data, False))
            if record is None:
                blank += 1  # whitespace needs no account
                continue
            if record.__class__ is str:
                out.append(self._quarantine(at, length, record))
                continue
            self._offset = at
            try:
                # The time's type is checked before any state changes; the time itself
                # is read only for a record with events (most records have none).
                when = stamp(record)
                events = handle(record)
                if events:
                    when = source_time(seconds(when))
            except TooDeep:
                out.append(self._quarantine(at, length, TOO_DEEP))
                continue
            except UsageRefused as refused:
                # A usage figure no response can have: the record is evidence, not a count.
                out.append(self._quarantine(at, length, refused.reason))
                continue
            except (WrongType, TypeError, AttributeError, KeyError, ValueError):
                # Wrong types deep inside a record: refuse the record, keep going.
                out.append(self._quarantine(at, length, WRONG_TYPE))
                continue
            if len(events) == 1:  # the common case, without a comprehension's frame
                out.append(Parsed(events[0], at, length, 0, when))
            elif events:
                out.extend([Parsed(event, at, length, i, when) for i, event in enumerate(events)])
        self.records += len(frames) - blank  # every frame is a record but blank lines
        return out

    def _quarantine(self, offset: int, length: int, reason: str) -> Parsed:
        event = Quarantined(source=self.source, offset=offset, length=length, reason=reason)
        return Parsed(event, offset, length, 0, None)

    # -- for subclasses --------------------------------------------------------

    def _events(self, record: dict) -> list[Event]:
        raise NotImplementedError

    def _time(self, record: dict) -> float | None:
        return None

    def _stamp(self, record: Any) -> Any:
        """The record's source time as read, its type checked (``WrongType``): read
        before the record's events change any state. By default the time itself."""
        return self._time(record)

    def _seconds(self, stamp: Any) -> float | None:
        """What ``_stamp`` read, as epoch seconds; asked only of records with events."""
        return stamp

    def _user_message(self, text: str, **ids: Any) -> UserMessage:
        p = payload(text, retain=self.retain_payloads)
        return UserMessage(digest=p.digest, size=p.size, text=p.text, **ids)

    def _agent_message(self, text: str, **ids: Any) -> AgentMessage:
        p = payload(text, retain=self.retain_payloads)
        return AgentMessage(digest=p.digest, size=p.size, text=p.text, ack_tokens=ack_tokens(text), **ids)

    def _classify(self, command: str | None) -> tuple[bool, bool]:
        return self.patterns.classify(command) if command else (False, False)

    def _item_started(
        self, item_id: str, item_type: str, *, command: str | None = None, args: Any = None, **ids: Any
    ) -> ItemStarted:
        critical, external = self._classify(command)
        return ItemStarted(
            item_id=item_id, item_type=item_type, critical=critical, external=external,
            args_digest=None if args is None else digest(args),
            command=kept_command(command, retain=self.retain_payloads), **ids,
        )

    def _item_completed(
        self, item_id: str, item_type: str, *, command: str | None = None, args: Any = None,
        output: Any = None, flags: tuple[bool, bool] | None = None, **fields: Any,
    ) -> ItemCompleted:
        # ``flags``: critical/external from the start, when the end lacks the command.
        critical, external = flags if flags is not None else self._classify(command)
        output_digest, output_size = (None, None) if output is None else measure(output)
        return ItemCompleted(
            item_id=item_id, item_type=item_type, critical=critical, external=external,
            args_digest=None if args is None else digest(args),
            output_digest=output_digest, output_size=output_size, **fields,
        )


# -- field readers: the wrong type quarantines the record ----------------------


def text(record: dict, key: str, default: str | None = None) -> str | None:
    return as_text(record.get(key, default), key)


def as_text(value: Any, key: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise WrongType(key)


def obj(record: dict, key: str) -> dict:
    """A nested object; a missing one reads as empty."""
    return as_obj(record.get(key), key)


def as_obj(value: Any, key: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    raise WrongType(key)


def items(record: dict, key: str) -> list:
    return as_list(record.get(key), key)


def as_list(value: Any, key: str) -> list:
    """A list; a missing one reads as empty."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    raise WrongType(key)


def integer(record: dict, key: str) -> int | None:
    return as_integer(record.get(key), key)


def as_integer(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise WrongType(key)


def command_text(command: Any) -> str | None:
    """A command given as an argv list or a string, as one line for classification."""
    if command is None or isinstance(command, str):
        return command
    if isinstance(command, list):
        return " ".join(str(part) for part in command)
    raise WrongType("command")


def source_time(value: float | None) -> float | None:
    """A source time as epoch seconds; None when it is no time at all (beyond a double,
    or outside years 1 to 9999): like an unreadable time, missing information."""
    if value is None or not EARLIEST <= value <= LATEST:  # compared before float(): ints may be huge
        return None
    return float(value)


def iso_time(value: Any) -> float | None:
    """Epoch seconds of an ISO-8601 timestamp (``Z`` or an offset; naive means UTC)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise WrongType("timestamp")
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None  # an unreadable time is missing information, not bad input
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


class Call(NamedTuple):
    """What a completion needs to know about the start of its tool call."""

    turn_id: str | None
    item_type: str
    tool: str | None
    critical: bool
    external: bool


class OpenCalls:
    """Tool calls started and not yet completed, keyed by call id.

    A completion may be reported twice: once in the tool's answer to the model
    (``function_call_output``) and once by the process itself (an
    ``exec_command_end`` or ``item_completed``, *authoritative*: it has the exit
    code and comes even after an interrupt). The first report is used; an
    authoritative one that follows a weaker one supersedes it; anything else is a
    repeat. Completed ids are remembered in a bounded window.
    """

    def __init__(self, remember: int = 512) -> None:
        self._open: dict[str, Call] = {}
        self._done: collections.OrderedDict[str, tuple[Call | None, bool]] = collections.OrderedDict()
        self._remember = remember

    def start(self, call_id: str, call: Call) -> bool:
        """Record a start; False when this call was already started or done."""
        if call_id in self._open or call_id in self._done:
            return False
        self._open[call_id] = call
        return True

    def abandon(self) -> list[tuple[str, Call]]:
        """Every call still open, now settled (its process is gone): later reports are repeats."""
        abandoned = list(self._open.items())
        for call_id, _ in abandoned:
            self.finish(call_id, authoritative=True)
        return abandoned

    def repeated(self, call_id: str, *, authoritative: bool) -> bool:
        """Whether ``finish`` would call this report a repeat (asking changes nothing)."""
        if call_id not in self._done:
            return False
        _, settled = self._done[call_id]
        return settled or not authoritative

    def finish(self, call_id: str, *, authoritative: bool) -> Call | None | bool:
        """The call's start (None when unseen) when this report is news; False for a repeat."""
        if call_id in self._done:
            call, settled = self._done[call_id]
            if settled or not authoritative:
                return False
            self._done[call_id] = (call, True)
            return call
        call = self._open.pop(call_id, None)
        self._done[call_id] = (call, authoritative)
        if len(self._done) > self._remember:
            self._done.popitem(last=False)
        return call
