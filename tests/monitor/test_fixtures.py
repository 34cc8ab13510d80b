"""Every recorded session: expected counts, chunk-independence, every byte accounted for."""

import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.monitor.support import SESSIONS, parse
from tillerman.monitor.counts import count
from tillerman.monitor.formats import detect_format
from tillerman.monitor.lines import Line, decode_object

EXPECTED = tomllib.loads((SESSIONS / "expected.toml").read_text())
FIXTURES = sorted(EXPECTED)


def test_the_table_lists_every_fixture():
    on_disk = {p.relative_to(SESSIONS).as_posix() for p in SESSIONS.rglob("*.jsonl")}
    assert on_disk == set(EXPECTED)


def test_every_format_has_a_fixture():
    assert {row["format"] for row in EXPECTED.values()} == {
        "codex-rollout", "codex-exec", "codex-tui", "claude-transcript", "claude-stream-json", "claude-hooks",
        "appserver-trace"}


@pytest.mark.parametrize("name", FIXTURES)
def test_expected_counts(name):
    row = EXPECTED[name]
    data = (SESSIONS / name).read_bytes()
    assert detect_format(data[:4096], name) == row["format"]
    parsed, parser = parse(row["format"], data, source=name)
    counts = count(p.event for p in parsed)
    assert {"format": row["format"], "records": parser.records, **msgspec_dict(counts)} == row


def msgspec_dict(struct) -> dict:
    return {field: getattr(struct, field) for field in struct.__struct_fields__}


@pytest.mark.parametrize("name", FIXTURES)
def test_every_byte_is_accounted_for(name):
    """Events and quarantine records cover whole lines; a line they do not cover is
    blank or a well-formed record the parser read and found nothing in."""
    data = (SESSIONS / name).read_bytes()
    parsed, _ = parse(EXPECTED[name]["format"], data, source=name)
    ranges = {(p.offset, p.length) for p in parsed}
    offset = 0
    for line in data.splitlines(keepends=True):
        if (offset, len(line)) not in ranges:
            assert not line.strip() or isinstance(decode_object(Line(offset, len(line), line.rstrip(b"\n"), True)),
                                                  dict), (offset, line[:80])
        ranges.discard((offset, len(line)))
        offset += len(line)
    assert ranges == set()  # no event points anywhere but at a whole line


@pytest.mark.parametrize("name", FIXTURES)
def test_one_byte_chunks_give_the_same_result(name):
    fmt = EXPECTED[name]["format"]
    data = (SESSIONS / name).read_bytes()
    whole, _ = parse(fmt, data, source=name)
    split, _ = parse(fmt, data, source=name, chunks=[1] * len(data))
    assert split == whole


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(FIXTURES), cuts=st.lists(st.integers(min_value=0, max_value=4096), max_size=12))
def test_any_split_gives_the_same_result(name, cuts):
    fmt = EXPECTED[name]["format"]
    data = (SESSIONS / name).read_bytes()
    whole, _ = parse(fmt, data, source=name)
    split, _ = parse(fmt, data, source=name, chunks=cuts)
    assert split == whole


@pytest.mark.parametrize("name", [n for n in FIXTURES if n.startswith("public/")])
def test_public_recordings_parse_sanely(name):
    row = EXPECTED[name]
    assert row["quarantined"] == 0
    assert row["records"] > 0
