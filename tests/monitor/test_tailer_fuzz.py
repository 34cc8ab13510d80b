"""Hypothesis throws hostile content at the tailer, written in arbitrary pieces: nothing
crashes (not even a logged exception), every byte range is accounted for by events or
quarantine records (or is blank, or a well-formed record the format keeps quiet about),
the stored offset never passes a partial line, and what was read live equals one pass of
the parser over the whole file."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.monitor.tailer_support import drive, rollout_line, rollout_name, session_meta
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.formats import PARSERS
from tillerman.monitor.identity import file_identity, read_first_line
from tillerman.monitor.tailer import Tailer, file_envelope, file_source

MAX_LINE = 512
_json = msgspec.json.Decoder()


def _claude(i: int) -> bytes:
    record = {"type": "assistant", "sessionId": "s1", "uuid": f"u{i}", "timestamp": "2026-11-30T00:00:00Z",
              "message": {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "Bash",
                                                            "input": {"command": "ls"}}]}}
    return json.dumps(record).encode() + b"\n"


_records = st.one_of(
    st.integers(0, 500).map(rollout_line),
    st.integers(0, 500).map(lambda i: rollout_line(i, "task_started", turn_id=f"turn-{i}")),
    st.integers(0, 500).map(lambda i: rollout_line(i, "task_complete", turn_id=f"turn-{i}")),
    st.integers(0, 500).map(_claude),
    st.just(session_meta()),
)
_hostile = st.one_of(
    _records.map(lambda r: r[: len(r) // 2] + b"\n"),  # truncated JSON
    _records.map(lambda r: r.replace(b"line", b"\xff\xfeli")),  # invalid UTF-8
    _records.map(lambda r: r.replace(b":", b":\x00", 1)),  # NUL bytes
    st.integers(MAX_LINE, 3 * MAX_LINE).map(lambda n: b'{"x": "' + b"a" * n + b'"}\n'),  # over-long
    st.binary(min_size=1, max_size=300),  # binary garbage, newlines anywhere
    st.just(b'{"type": "event_msg", "payload": {"type": "agent_message", "message": 7}}\n'),  # wrong type
    st.just(b'{"type": "response_item", "payload": []}\n'),
    st.just(b"[]\n"), st.just(b"\n"), st.just(b"   \n"), st.just(b"null\n"),
    st.integers(129, 240).map(lambda n: b'{"x": ' + b"[" * n + b"]" * n + b"}\n"),  # nested too deep
    st.sampled_from([b"1e400", b"9" * 30, b"-1e400"]).map(  # numbers beyond 64 bits or a double
        lambda n: b'{"type": "event_msg", "payload": {"type": "exec_command_end", "exit_code": ' + n + b"}}\n"),
    st.sampled_from([b'"0001-01-01T00:00:00+01:00"', b'"+275760-09-13T00:00:00Z"', b"1e300"]).map(  # no time
        lambda t: b'{"timestamp": ' + t + b', "type": "event_msg", "payload": {"type": "agent_message",'
                  b' "message": "m"}}\n'),
)
_content = st.lists(st.one_of(_records, _hostile), min_size=1, max_size=25).map(b"".join)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(head=st.sampled_from([session_meta(), _claude(0), b""]), body=_content,
       cuts=st.lists(st.integers(1, 700), min_size=1, max_size=12))
def test_hostile_content_is_accounted_for_byte_by_byte(head, body, cuts):
    data = head + body
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / rollout_name()
        errors = _Errors()
        logging.getLogger("tillerman").addHandler(errors)
        try:
            with SQLiteRecorder(":memory:") as ledger:
                tailer = Tailer(max_line=MAX_LINE)
                start, i = 0, 0
                while start < len(data):
                    end = min(len(data), start + cuts[i % len(cuts)])
                    with open(path, "ab") as fh:
                        fh.write(data[start:end])
                    drive(tailer, ledger, path)
                    start, i = end, i + 1
                live = [e.envelope for e in ledger.read()]
                rows = ledger.file_offsets()
        finally:
            logging.getLogger("tillerman").removeHandler(errors)
        assert errors.records == [], errors.records
        consumed = rows[0].offset if rows else 0
        _accounted(data, consumed, live)
        if rows:
            assert consumed == data.rfind(b"\n") + 1  # never past a partial line, never short of a whole one
            assert [_key(e) for e in live] == _one_pass(path, rows[0].format, consumed)


def _accounted(data: bytes, consumed: int, envelopes) -> None:
    ranges = sorted({(e.offset, e.length) for e in envelopes if e.offset is not None})
    at = 0
    for offset, length in ranges:
        assert offset >= at, ("overlap", offset, at)
        _quiet(data[at:offset])
        at = offset + length
    assert at <= consumed or consumed == 0 and not ranges
    _quiet(data[at:consumed])
    assert b"\n" not in data[consumed:] or not ranges and consumed == 0


def _quiet(span: bytes) -> None:
    """Bytes no event accounts for: blank lines, or well-formed records the format keeps
    quiet about (never garbage)."""
    for line in span.split(b"\n"):
        if line.strip():
            assert isinstance(_json.decode(line), dict), line


def _one_pass(path: Path, fmt: str, consumed: int) -> list[tuple]:
    source = file_source(path)
    parser = PARSERS[fmt](source, max_line=MAX_LINE)
    identity = file_identity(path, read_first_line(path))
    parsed = parser.feed(path.read_bytes()) + parser.close()
    return [_key(file_envelope(identity, source, p)) for p in parsed if p.offset < consumed]


def _key(env) -> tuple:
    return (env.event_id, msgspec.json.encode(env.event), env.source, env.at, env.offset, env.length)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())
