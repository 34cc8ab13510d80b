"""A sans-IO JSON-lines framer and record decoder shared by every format.

``LineFramer.feed(bytes)`` returns the complete lines in that chunk with their
byte offset and length (newline included), keeping an incomplete last line until
its newline arrives; ``close()`` hands back an unterminated tail. A line longer
than ``max_line`` is never held: once the limit is passed the framer only counts
bytes until the next newline and then reports the whole range as skipped. So the
memory used is bounded by ``max_line`` plus one chunk, whatever the file size, and
every byte range comes back either as a line or as a skipped range. ``split`` is the
same without a ``Line`` per line (bodies only, offsets implied by their lengths), with
one ``bytes.split`` per chunk: the parsers' path.

``decode_json`` is the one place untrusted JSON is decoded (file records, the
app-server's frames, JSON inside their strings); ``decode_object`` turns a line into
a dict or the reason it is refused. ``TypedLines`` reads a format's lines into its
msgspec Structs, skipping the fields no event uses; it refuses what ``decode_object``
refuses, except a number beyond a double or nesting past ``MAX_DEPTH`` inside a skipped
field (see ``TypedLines``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

MAX_LINE = 64 * 1024 * 1024
# Nesting levels a JSON value may have. Real records nest a dozen levels or so. The
# limit is fixed and far below Python's recursion limit (1000 frames), so a value that
# decodes can still be digested, encoded and redacted by recursive code, and a record
# reads the same in every process whatever the depth of the caller's stack.
MAX_DEPTH = 128

# Quarantine reasons (the ``reason`` of a ``quarantined`` event).
INVALID_UTF8 = "invalid_utf8"
NUL_BYTES = "nul_bytes"
INVALID_JSON = "invalid_json"
NOT_AN_OBJECT = "not_an_object"
LINE_TOO_LONG = "line_too_long"
TRUNCATED = "truncated"
WRONG_TYPE = "wrong_type"
TOO_DEEP = "too_deep"
NUMBER_OUT_OF_RANGE = "number_out_of_range"


class Line(NamedTuple):
    offset: int
    length: int  # bytes in the source, newline included
    data: bytes  # without the newline
    terminated: bool  # False for a tail that ended without a newline


class Skipped(NamedTuple):
    offset: int
    length: int
    reason: str


class LineFramer:
    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._pending = bytearray()
        self._offset = 0  # source offset of the first byte not yet returned
        self._discarding = False  # inside an over-long line: count, don't keep
        self._discarded = 0
        self._pending_ascii = True  # every byte pending is ASCII (False: not known)
        self.ascii = True  # of the lines ``split`` returned last

    def split(self, data: bytes) -> list[bytes | Skipped]:
        """The complete lines ``data`` ends, as their bodies (without the newline: each
        stands for its length plus one bytes of the source, from ``consumed`` on), and
        the over-long ranges skipped, in source order. ``ascii`` then says whether every
        returned body is known to be ASCII (so valid UTF-8) without looking at each."""
        data_ascii = data.isascii()
        if not self._discarding and len(data) <= self.max_line:
            # The common case in one ``bytes.split``: only a line continuing what is
            # pending, or the new pending tail, can be over-long.
            pieces = data.split(b"\n")
            rest = pieces.pop()
            pending = len(self._pending)
            if pieces and pending + len(pieces[0]) <= self.max_line and len(rest) <= self.max_line:
                if pending:
                    pieces[0] = bytes(self._pending) + pieces[0]
                self.ascii = data_ascii and self._pending_ascii
                self._offset += pending + len(data) - len(rest)
                self._pending = bytearray(rest)
                self._pending_ascii = data_ascii or rest.isascii()
                return pieces
            if not pieces and pending + len(rest) <= self.max_line:
                self._pending += rest
                self._pending_ascii = self._pending_ascii and data_ascii
                return []
        self.ascii = False  # not worth tracking on this rare path: bodies are checked one by one
        return self._split_slowly(data)

    def feed(self, data: bytes) -> list[Line | Skipped]:
        """``split`` with each line's offset, length and body."""
        offset = self._offset
        out: list[Line | Skipped] = []
        for frame in self.split(data):
            if frame.__class__ is bytes:
                out.append(Line(offset, len(frame) + 1, frame, True))
                offset += len(frame) + 1
            else:
                out.append(frame)
                offset += frame.length
        return out

    def _split_slowly(self, data: bytes) -> list[bytes | Skipped]:
        out: list[bytes | Skipped] = []
        start, end = 0, len(data)
        while start < end:
            nl = data.find(b"\n", start)
            if self._discarding:
                if nl < 0:
                    self._discarded += end - start
                    break
                self._discarded += nl + 1 - start
                out.append(self._end_discard())
            else:
                body_len = len(self._pending) + ((nl if nl >= 0 else end) - start)
                if body_len > self.max_line:
                    # Drop what we hold and switch to counting; the line is
                    # reported once its newline (or the end of input) is seen.
                    self._discarding = True
                    self._discarded = len(self._pending)
                    self._pending = bytearray()
                    continue
                if nl < 0:
                    self._pending += data[start:end]
                    self._pending_ascii = False
                    break
                if self._pending:
                    self._pending += data[start:nl]
                    body = bytes(self._pending)
                    self._pending = bytearray()
                else:
                    body = data[start:nl]
                out.append(body)
                self._offset += len(body) + 1
            start = nl + 1
        return out

    @property
    def consumed(self) -> int:
        """Source offset just past the last line or range returned: a line boundary."""
        return self._offset

    def close(self) -> list[Line | Skipped]:
        """End of input: the unterminated tail, if any."""
        if self._discarding:
            return [self._end_discard()]
        if not self._pending:
            return []
        body = bytes(self._pending)
        self._pending = bytearray()
        line = Line(self._offset, len(body), body, False)
        self._offset += len(body)
        return [line]

    def _end_discard(self) -> Skipped:
        skipped = Skipped(self._offset, self._discarded, LINE_TOO_LONG)
        self._offset += self._discarded
        self._discarding = False
        self._discarded = 0
        return skipped


_decoder = msgspec.json.Decoder()
_encode = msgspec.json.Encoder().encode


class TooDeep(msgspec.DecodeError):
    """JSON nested deeper than ``MAX_DEPTH`` levels. A ``DecodeError``, so code that
    treats undecodable JSON as plain text treats this the same."""


def decode_json(data: bytes | str) -> Any:
    """``data`` decoded, or ``msgspec.DecodeError`` (``TooDeep`` for nesting past
    ``MAX_DEPTH``); never another exception. msgspec recurses on the C stack and
    raises ``RecursionError`` at whatever depth the caller's stack leaves, which
    would escape every handler of bad input."""
    try:
        value = _decoder.decode(data)
    except RecursionError:
        raise TooDeep(f"nested deeper than {MAX_DEPTH} levels") from None
    # Each level takes two bytes at least: short data cannot be deep, no need to count.
    if len(data) > 2 * MAX_DEPTH and _brackets(data) > MAX_DEPTH and _deeper_than(value, MAX_DEPTH):
        raise TooDeep(f"nested deeper than {MAX_DEPTH} levels")
    return value


def _brackets(data: bytes | str) -> int:
    """Opening brackets in ``data``: each level opens one, so with few of them no value
    can be deep."""
    if isinstance(data, str):
        return data.count("[") + data.count("{")
    return data.count(b"[") + data.count(b"{")


def nested(value: Any, level: int) -> Any:
    """``value``, read from a record at nesting ``level`` (a field of the record itself
    is at level 2), or ``TooDeep`` when an object or array in it nests past
    ``MAX_DEPTH`` levels counted from the record, as ``decode_json`` counts them."""
    if isinstance(value, dict | list) and _maybe_deeper_than(value, MAX_DEPTH - level + 1):
        raise TooDeep(f"nested deeper than {MAX_DEPTH} levels")
    return value


def _maybe_deeper_than(value: dict | list, limit: int) -> bool:
    """``_deeper_than``, first bounded cheaply: a value whose JSON opens no more than
    ``limit`` brackets (strings' brackets counted too) nests no deeper than that."""
    try:
        if _brackets(_encode(value)) <= limit:
            return False
    except RecursionError:  # it was decoded, so it can be walked (iteratively)
        pass
    return _deeper_than(value, limit)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether a decoded value nests more than ``limit`` containers (iteratively: the
    walk itself must not recurse)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def decode_object(line: Line) -> dict | str | None:
    """The line's JSON object, a quarantine reason, or None for a blank line."""
    return decode_record(line.data, line.terminated)


def decode_record(data: bytes, terminated: bool = True) -> dict | str | None:
    """``decode_object`` of a line's body (``terminated``: its newline was seen)."""
    if not data.strip():
        return None
    if b"\x00" in data:
        return NUL_BYTES
    try:
        value = decode_json(data)
    except TooDeep:
        return TOO_DEEP
    except msgspec.DecodeError as exc:
        message = str(exc)
        if "UTF-8" in message:
            return INVALID_UTF8
        if "truncated" in message or not terminated:
            return TRUNCATED
        if "out of range" in message:
            return NUMBER_OUT_OF_RANGE
        return INVALID_JSON
    if not isinstance(value, dict):
        return NOT_AN_OBJECT
    return value


class TypedLines:
    """Lines decoded into ``line_type``: a msgspec Struct, or a tagged union of them,
    for the records a format reads. Fields a Struct does not declare are skipped, not
    decoded, so a record whose type no event uses costs a look at its type.

    ``decode`` returns the Struct; the plain dict when the record does not fit
    ``line_type`` (an unknown type, a field of a shape the Structs do not take); or what
    ``decode_object`` returns: None for a blank line, the reason a line is refused.

    What a skipped field must be: valid JSON (msgspec checks its syntax while skipping)
    and valid UTF-8 (checked here, as msgspec does not look inside a skipped string).
    Its numbers' range and its depth are not checked: skipped content never becomes a
    Python value, so nothing can overflow on it or recurse into it. The fields a Struct
    declares are decoded, and refused as ``decode_object`` refuses them (a number
    beyond a double fails the typed decode; the parser checks the depth of what it
    reads as an object or array, ``parser.nested``). A line the typed decode does not
    take is decoded whole by ``decode_object``, and refused exactly as it decides.
    """

    def __init__(self, line_type: Any, *, check_depth: Callable[[Any], None] | None = None) -> None:
        self._type = line_type
        self._decode = msgspec.json.Decoder(line_type).decode
        # ``check_depth(record)`` raises ``TooDeep`` for a Struct whose fields read whole
        # nest too deep: asked only of a line with brackets enough to be (as ``decode_json``
        # asks), the line then refused as too deep before any handler reads it.
        self._check_depth = check_depth

    def decode(self, data: bytes, terminated: bool = True, utf8: bool = False) -> Any:
        """The record in a line's body; ``utf8``: the body is known to be valid UTF-8."""
        if utf8 or data.isascii() or valid_utf8(data):
            try:
                record = self._decode(data)
            except (msgspec.DecodeError, RecursionError):  # not a record of this shape: see below
                pass
            else:
                if self._check_depth is not None and len(data) > 2 * MAX_DEPTH and _brackets(data) > MAX_DEPTH:
                    try:
                        self._check_depth(record)
                    except TooDeep:
                        return TOO_DEEP
                return record
        record = decode_record(data, terminated)
        if not isinstance(record, dict):
            return record
        try:
            return msgspec.convert(record, self._type)
        except msgspec.ValidationError:
            return record


def valid_utf8(data: bytes) -> bool:
    """Whether ``data`` is valid UTF-8."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
