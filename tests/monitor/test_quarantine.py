"""Bad input of every kind, in every format: quarantined with its byte range, never raised."""

import pytest

from tests.monitor.support import parse
from tillerman.monitor.formats import PARSERS

# A well-formed record of each format, and one whose nested field has the wrong type.
GOOD = {
    "codex-rollout": b'{"timestamp":"2026-11-30T00:00:00Z","type":"event_msg","payload":{"type":"task_started","turn_id":"T"}}',
    "codex-exec": b'{"type":"turn.started"}',
    "codex-tui": b'{"ts":"2025-09-14T08:30:00Z","dir":"to_tui","kind":"codex_event","payload":{"id":"1","msg":{"type":"task_started"}}}',
    "claude-transcript": b'{"type":"user","sessionId":"s","uuid":"u","message":{"role":"user","content":"hi"}}',
    "claude-stream-json": b'{"type":"system","subtype":"init","session_id":"s","user_message_uuids":["u"]}',
    "claude-hooks": b'{"session_id":"s","hook_event_name":"UserPromptSubmit","prompt_id":"p","prompt":"hi"}',
    "claude-hook-log": b'{"ts":"2026-12-01T09:00:00Z","event":"UserPromptSubmit","session_id":"s","prompt_id":"p","prompt":"hi"}',
    "appserver-trace": b'{"ts":1.0,"dir":"in","msg":{"method":"turn/started","params":{"threadId":"t","turn":{"id":"u"}}}}',
}
WRONG_TYPE = {
    "codex-rollout": b'{"timestamp":"2026-11-30T00:00:00Z","type":"event_msg","payload":5}',
    "codex-exec": b'{"type":"item.completed","item":[1]}',
    "codex-tui": b'{"ts":"2025-09-14T08:30:00Z","dir":"to_tui","kind":"codex_event","payload":{"id":"1","msg":"task_started"}}',
    "claude-transcript": b'{"type":"assistant","sessionId":"s","message":{"content":{"text":1}}}',
    "claude-stream-json": b'{"type":"assistant","session_id":"s","message":{"content":{"text":1}}}',
    "claude-hooks": b'{"session_id":"s","hook_event_name":"PreToolUse","tool_input":[1]}',
    "claude-hook-log": b'{"ts":"2026-12-01T09:00:00Z","event":"PreToolUse","payload":{"session_id":"s","tool_input":[1]}}',
    "appserver-trace": b'{"ts":1.0,"dir":"in","msg":{"method":"turn/started","params":{"threadId":7}}}',
}
BAD_LINES = [
    (b'{"a":"caf\xe9"}', "invalid_utf8"),
    (b'{"a":"x\x00y"}', "nul_bytes"),
    (b'{"a":', "truncated"),
    (b"{not json}", "invalid_json"),
    (b"[1,2,3]", "not_an_object"),
    (b"42", "not_an_object"),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "too_deep"),  # past msgspec's recursion limit
    (b"[" * 200 + b"]" * 200, "too_deep"),  # decodes, but past MAX_DEPTH
    (b'{"a":[1e400]}', "number_out_of_range"),
]


@pytest.mark.parametrize("fmt", sorted(PARSERS))
@pytest.mark.parametrize(("bad", "reason"), BAD_LINES)
def test_bad_lines_are_quarantined_and_reading_goes_on(fmt, bad, reason):
    data = GOOD[fmt] + b"\n" + bad + b"\n" + GOOD[fmt] + b"\n"
    parsed, parser = parse(fmt, data, source="bad.jsonl")
    quarantined = [p for p in parsed if p.event.__struct_config__.tag == "quarantined"]
    assert [(q.event.reason, q.event.offset, q.event.length, q.event.source) for q in quarantined] == [
        (reason, len(GOOD[fmt]) + 1, len(bad) + 1, "bad.jsonl")]
    assert (quarantined[0].offset, quarantined[0].length) == (len(GOOD[fmt]) + 1, len(bad) + 1)
    assert len(parsed) > 1 and parser.records == 3


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_wrong_types_are_quarantined(fmt):
    parsed, _ = parse(fmt, WRONG_TYPE[fmt] + b"\n" + GOOD[fmt] + b"\n")
    assert parsed[0].event.reason == "wrong_type"
    assert parsed[-1].event.__struct_config__.tag != "quarantined"


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_an_unterminated_last_line_is_truncated(fmt):
    parsed, _ = parse(fmt, GOOD[fmt] + b"\n" + GOOD[fmt][:-5])
    assert parsed[-1].event.reason == "truncated"
    assert parsed[-1].offset + parsed[-1].length == 2 * len(GOOD[fmt]) - 4


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_an_over_long_line_is_skipped(fmt):
    long_line = b'{"pad":"' + b"x" * 5000 + b'"}'
    parsed, _ = parse(fmt, long_line + b"\n" + GOOD[fmt] + b"\n", chunks=[100] * 60, max_line=1000)
    assert (parsed[0].event.reason, parsed[0].event.offset, parsed[0].event.length) == (
        "line_too_long", 0, len(long_line) + 1)
    assert parsed[-1].event.__struct_config__.tag != "quarantined"


@pytest.mark.parametrize("fmt", sorted(PARSERS))
def test_a_record_nested_to_the_limit_is_read(fmt):
    record = GOOD[fmt][:-1] + b', "pad": ' + b"[" * 127 + b"]" * 127 + b"}"  # 128 levels with the record
    parsed, _ = parse(fmt, record + b"\n")
    assert [p for p in parsed if p.event.__struct_config__.tag == "quarantined"] == []
