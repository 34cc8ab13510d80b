import json
import sys
import tracemalloc

import msgspec
import pytest

from tillerman.monitor.lines import (
    INVALID_JSON,
    INVALID_UTF8,
    LINE_TOO_LONG,
    NOT_AN_OBJECT,
    NUL_BYTES,
    NUMBER_OUT_OF_RANGE,
    TOO_DEEP,
    TRUNCATED,
    Line,
    LineFramer,
    Skipped,
    TooDeep,
    decode_json,
    decode_object,
)


def test_lines_carry_offset_and_length_including_the_newline():
    framer = LineFramer()
    out = framer.feed(b'{"a":1}\n\n{"b":2}\n')
    assert out == [Line(0, 8, b'{"a":1}', True), Line(8, 1, b"", True), Line(9, 8, b'{"b":2}', True)]


def test_a_partial_line_is_held_until_its_newline():
    framer = LineFramer()
    assert framer.feed(b'{"a":') == []
    assert framer.feed(b'1}\n{"b"') == [Line(0, 8, b'{"a":1}', True)]
    assert framer.feed(b":2}\n") == [Line(8, 8, b'{"b":2}', True)]
    assert framer.close() == []


def test_close_returns_the_unterminated_tail():
    framer = LineFramer()
    framer.feed(b'{"a":1}\n{"b":2}')
    assert framer.close() == [Line(8, 7, b'{"b":2}', False)]


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_an_over_long_line_is_skipped_and_accounted(chunk):
    data = b'{"ok":1}\n' + b"x" * 50 + b"\n" + b'{"ok":2}\n'
    framer = LineFramer(max_line=20)
    out = []
    for i in range(0, len(data), chunk):
        out += framer.feed(data[i:i + chunk])
    out += framer.close()
    assert out == [Line(0, 9, b'{"ok":1}', True), Skipped(9, 51, LINE_TOO_LONG), Line(60, 9, b'{"ok":2}', True)]


def test_a_line_of_exactly_max_line_is_kept():
    framer = LineFramer(max_line=5)
    assert framer.feed(b"12345\n123456\n") == [Line(0, 6, b"12345", True), Skipped(6, 7, LINE_TOO_LONG)]


def test_an_over_long_unterminated_tail_is_skipped_at_close():
    framer = LineFramer(max_line=4)
    assert framer.feed(b"abcdefgh") == []
    assert framer.close() == [Skipped(0, 8, LINE_TOO_LONG)]


def test_an_over_long_line_is_never_held_in_memory():
    framer = LineFramer(max_line=1 << 20)
    chunk = b"y" * (1 << 16)
    tracemalloc.start()
    try:
        for _ in range(160):  # a 10 MiB line, fed in 64 KiB chunks
            framer.feed(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 << 20
    assert framer.feed(b"\n") == [Skipped(0, 160 * (1 << 16) + 1, LINE_TOO_LONG)]


@pytest.mark.parametrize(("data", "terminated", "expected"), [
    (b'{"a":"\xff"}', True, INVALID_UTF8),
    (b'{"a":"x\x00"}', True, NUL_BYTES),
    (b'{"a":', True, TRUNCATED),
    (b'{"a":1} trailing', True, INVALID_JSON),
    (b'{"a":1} trailing', False, TRUNCATED),
    (b"[1, 2]", True, NOT_AN_OBJECT),
    (b'"text"', True, NOT_AN_OBJECT),
    (b"  \r", True, None),
    (b'{"a":1}\r', True, {"a": 1}),
    (b'{"a":' * 5000 + b"1" + b"}" * 5000, True, TOO_DEEP),
    (b'{"a":' * 129 + b"1" + b"}" * 129, True, TOO_DEEP),
    (b'{"a":' * 128 + b"1" + b"}" * 128, True, json.loads(b'{"a":' * 128 + b"1" + b"}" * 128)),
    (b'{"a":1e400}', True, NUMBER_OUT_OF_RANGE),
    (b'{"a":123456789012345678901234567890}', True, {"a": 123456789012345678901234567890}),
])
def test_decode_object(data, terminated, expected):
    assert decode_object(Line(0, len(data) + 1, data, terminated)) == expected


def test_decode_json_refuses_depth_as_a_decode_error_at_any_stack_depth():
    """msgspec's RecursionError depends on the caller's stack; ``decode_json`` turns it
    into ``TooDeep`` (a ``DecodeError``), even when called from deep inside a stack."""
    deep = "[" * 100_000 + "]" * 100_000

    def nested(levels: int):
        if levels:
            return nested(levels - 1)
        with pytest.raises(TooDeep):
            decode_json(deep)
        with pytest.raises(msgspec.DecodeError):
            decode_json(deep.encode())

    nested(sys.getrecursionlimit() - 100)


def test_split_gives_line_bodies_and_says_when_every_one_is_ascii():
    framer = LineFramer()
    assert framer.split(b'{"a":1}\n{"b"') == [b'{"a":1}'] and framer.ascii
    assert framer.consumed == 8
    # The pending start of a line was ASCII, its end is not: the line is not known ASCII.
    assert framer.split(b':"\xc3\xa9"}\n\n') == [b'{"b":"\xc3\xa9"}', b""] and not framer.ascii
    assert framer.split(b'{"c":2}\n') == [b'{"c":2}'] and framer.ascii
    assert framer.consumed == len(b'{"a":1}\n{"b":"\xc3\xa9"}\n\n{"c":2}\n')


def test_split_and_feed_frame_alike_across_chunks():
    data = b'{"a":1}\n\n' + b"x" * 30 + b'\n{"b":"\xff"}\n{"c"'
    for chunk in (1, 5, 64):
        split, fed = LineFramer(max_line=20), LineFramer(max_line=20)
        bodies, lines = [], []
        for i in range(0, len(data), chunk):
            bodies += split.split(data[i:i + chunk])
            lines += fed.feed(data[i:i + chunk])
        assert bodies == [line.data if isinstance(line, Line) else line for line in lines]
        assert split.consumed == fed.consumed == len(data) - 4
