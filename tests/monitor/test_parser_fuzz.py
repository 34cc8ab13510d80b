"""Hypothesis puts hostile values into real recorded records of every format — nesting
far past any limit, numbers beyond 64 bits or beyond a double, times out of any
calendar, NUL bytes, invalid UTF-8 — and checks that each parser never raises, that
every line comes out as events or as a quarantine record with its byte range (or is a
record the format keeps quiet about), and that whatever comes out a ledger can store
and read back."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.monitor.support import SESSIONS
from tillerman.ledger.events import Quarantined
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.formats import PARSERS
from tillerman.monitor.identity import file_identity
from tillerman.monitor.parser import EARLIEST, LATEST
from tillerman.monitor.tailer import file_envelope

FILES = {fmt: sorted((SESSIONS / fmt).rglob("*.jsonl")) for fmt in PARSERS}
# The real CLI's stdout and hook payloads, recorded beside its transcripts.
FILES["claude-stream-json"] = sorted((SESSIONS / "claude-live").rglob("stdout.jsonl"))
FILES["claude-hooks"] = sorted((SESSIONS / "claude-live").rglob("hooks.jsonl"))
FILES["claude-hook-log"] = [SESSIONS.parent / "hook-logs" / "hooks.jsonl"]  # kept apart: see its SOURCES row


def _records(fmt: str) -> list:
    found = []
    for path in FILES[fmt]:
        for line in path.read_bytes().splitlines()[:40]:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue  # the recordings hold hostile lines of their own
    return found


TEMPLATES = {fmt: _records(fmt) for fmt in PARSERS}
HOLE = "\x01hole\x01"
TIME_KEYS = frozenset({"timestamp", "ts", "emittedAtMs", "startedAtMs"})
class _AnyObject(msgspec.Struct):
    """A JSON object, its fields skipped: checked for syntax only, as a Codex rollout
    skips the fields of a record it ignores."""


_object = msgspec.json.Decoder(_AnyObject)

HOSTILE = st.sampled_from([
    b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 5_000 + b"1" + b"}" * 5_000, b"[" * 129 + b"]" * 129,
    b"[" * 127 + b"]" * 127,
    b"123456789012345678901234567890", str(2**64).encode(), str(-(2**63) - 1).encode(), b"1" * 400,
    b"1e400", b"-1e400", b"1e308", b"-0.0", b"1e-400",
    b'"0001-01-01T00:00:00+01:00"', b'"9999-12-31T23:59:59-23:59"', b'"+275760-09-13T00:00:00Z"',
    b'"2026-13-45T99:99:99Z"', b"1e300", b"-1e300", b"253402300800", b"-62135596801", b"1e20",
    b'"a\\u0000b"', b'"a\x00b"', b'"\xff\xfe"', b'"\xed\xa0\x80"', b'"\\ud800"',
    b"null", b"true", b"{}", b"[]", b'""',
])


def _leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    if path:
        yield path


def _with_hole(node, path):
    if not path:
        return HOLE
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = _with_hole(node[path[0]], path[1:])
    return copy


@st.composite
def hostile_lines(draw, fmt: str) -> bytes:
    record = draw(st.sampled_from(TEMPLATES[fmt]))
    paths = list(_leaves(record))
    timed = [p for p in paths if p[-1] in TIME_KEYS]  # where each format keeps its clock: often
    path = draw(st.sampled_from(timed) | st.sampled_from(paths) if timed else st.sampled_from(paths)) if paths else ()
    raw = draw(HOSTILE)
    return json.dumps(_with_hole(record, path)).encode().replace(json.dumps(HOLE).encode(), raw)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_hostile_values_in_every_format_are_read_or_quarantined(data, tmp_path_factory):
    for fmt in sorted(PARSERS):
        lines = data.draw(st.lists(st.one_of(hostile_lines(fmt), st.sampled_from(TEMPLATES[fmt]).map(
            lambda r: json.dumps(r).encode())), min_size=1, max_size=6), label=fmt)
        blob = b"".join(line + b"\n" for line in lines)
        parser = PARSERS[fmt]("fuzz.jsonl")
        parsed = parser.feed(blob) + parser.close()
        _accounted(blob, parsed)
        for p in parsed:
            assert p.at is None or (isinstance(p.at, float) and math.isfinite(p.at) and EARLIEST <= p.at <= LATEST)
            if isinstance(p.event, Quarantined):
                assert p.event.reason and (p.event.offset, p.event.length) == (p.offset, p.length)
        _stored_and_read_back(tmp_path_factory.mktemp(fmt) / "f.jsonl", blob, parsed)


def _accounted(blob: bytes, parsed) -> None:
    """Every line is covered by what came out of it, or is a record the format ignores:
    valid UTF-8 and a JSON object (numbers and depth inside unread fields unchecked)."""
    covered = {(p.offset, p.length) for p in parsed}
    offset = 0
    for line in blob.split(b"\n")[:-1]:
        if (offset, len(line) + 1) not in covered:
            line.decode("utf-8")
            _object.decode(line)
        offset += len(line) + 1


def _stored_and_read_back(path: Path, blob: bytes, parsed) -> None:
    path.write_bytes(blob)
    identity = file_identity(path, blob[: blob.find(b"\n") + 1])
    envelopes = [file_envelope(identity, "file:fuzz", p) for p in parsed]
    with SQLiteRecorder(":memory:") as ledger:
        appended = ledger.append(envelopes).entries
        stored = [msgspec.structs.replace(e.envelope, observed_at=None) for e in ledger.read()]
        assert stored == envelopes
        assert list(appended) == list(ledger.read())  # what a writer folds is what a reader folds
        assert ledger.verify().ok
