"""Parsing reads records into msgspec Structs now, and skips what no event uses; the
events must be the ones the dict-reading parsers produced, byte for byte.

``parse_digests.json`` holds, for every input below, a digest of the parse as the
dict-reading parsers produced it (all ``Parsed`` events in order, the record count,
the unknown types). The inputs: every recorded session in ``fixtures/sessions``; a
generated benchmark rollout; and each fixture rewritten record by record into
valid-but-odd shapes (a body that is a list, a number where a string was, a key
dropped, a type no format has) and into lines a typed decode could read differently from
a full one (a number out of range, invalid UTF-8 or nesting past the limit inside a field
no event reads, and inside one an event reads; a repeated key). Claude inputs are read twice: under the rollout name like every input,
and at their own fixture path, where a subagent's file is its own thread. Regenerate
the file only for a change that means to alter events:
``python -m tests.monitor.test_parse_unchanged > tests/monitor/parse_digests.json``.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tempfile
from pathlib import Path

import msgspec
import pytest

from tillerman.ledger.events import Quarantined
from tillerman.monitor.formats import PARSERS, detect_format
from tillerman.monitor.parser import Parsed

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ROOT / "fixtures" / "sessions"
GOLDEN = Path(__file__).with_name("parse_digests.json")
ODD_VALUES = ([], [1, "a"], {}, {"type": 7}, 0, -3, 2.5, True, False, None, "", "text", "sha256", 10**30)


ROLLOUT_SOURCE = "rollout-2026-11-30T00-00-00-01a229c4-3717-7c10-9d2e-5b7f0c9e1a01.jsonl"


def parse_digest(fmt: str, data: bytes, chunk: int = 4096, source: str = ROLLOUT_SOURCE) -> str:
    parser = PARSERS[fmt](source=source)
    out = hashlib.sha256()

    def digested(parsed: Parsed) -> None:  # by field name, whatever shape the Struct is encoded in
        out.update(msgspec.json.encode(msgspec.structs.asdict(parsed)) + b"\n")

    for start in range(0, len(data), chunk):
        for parsed in parser.feed(data[start:start + chunk]):
            digested(parsed)
    for parsed in parser.close():
        digested(parsed)
    out.update(json.dumps([parser.records, sorted(parser.unknown_types.items())]).encode())
    return out.hexdigest()


def fixture_inputs() -> dict[str, tuple[str, bytes]]:
    """Recorded sessions: name → (format, bytes)."""
    found = {}
    for path in sorted(SESSIONS.rglob("*.jsonl")):
        data = path.read_bytes()
        fmt = detect_format(data[:65536], str(path))
        if fmt is not None:
            found[str(path.relative_to(SESSIONS))] = (fmt, data)
    return found


def bench_input() -> bytes:
    from bench.sessions import write_rollout

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rollout.jsonl"
        write_rollout(str(path), 4000, seed=3)
        return path.read_bytes()


def _nodes(value, path=()):
    """Every (path, value) inside a decoded record."""
    yield path, value
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _nodes(child, (*path, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _nodes(child, (*path, i))


def _replace(record, path, new):
    if not path:
        return None if new is _DROP else new
    node = record
    for step in path[:-1]:
        node = node[step]
    if new is _DROP and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = None if new is _DROP else new
    return record


_DROP = object()


def mutated(data: bytes, seed: int) -> bytes:
    """Each JSON-object line of ``data`` rewritten a few times into odd shapes, plus
    raw lines a typed decode could read differently from a full one."""
    rnd = random.Random(seed)
    out: list[bytes] = []
    for line in data.split(b"\n"):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        for _ in range(3):
            copy = json.loads(line)
            path, _ = rnd.choice(list(_nodes(copy)))
            new = rnd.choice((*ODD_VALUES, _DROP))
            out.append(json.dumps(_replace(copy, path, json.loads(json.dumps(new)) if new is not _DROP else new),
                                  separators=(",", ":")).encode())
        text = json.dumps(record, separators=(",", ":")).encode()
        body = text[1:]
        # Where nothing reads them, a rollout and a Claude transcript skip these (the other
        # formats decode the whole record and refuse them): only invalid UTF-8 is refused
        # wherever it is. (Transcripts were read as dicts until their Structs came: their
        # mutated inputs' digests changed then, on these lines alone.)
        out.append(b'{"zz_skipped":1e400,' + body)
        out.append(b'{"zz_skipped":[0,-12.5E+309],' + body)
        out.append(b'{"zz_skipped":' + b"9" * 250 + b"e99," + body)
        out.append(b'{"zz_skipped":"\xff\xfe",' + body)
        out.append(b'{"zz_skipped":' + b"[" * 130 + b"]" * 130 + b"," + body)
        # Where they are read (the last of repeated keys counts), every format refuses them.
        out.append(text[:-1] + b',"timestamp":1e400}')
        out.append(text[:-1] + b',"payload":' + b"[" * 130 + b"]" * 130 + b"}")
        out.append(text[:-1] + b',"message":' + b"[" * 130 + b"]" * 130 + b"}")  # read by a transcript
        out.append(text[:-1] + b',"toolUseResult":' + b"[" * 130 + b"]" * 130 + b"}")  # read whole, as Any
        out.append(b'{"zz_skipped":' + b"[" * 100 + b"]" * 100 + b"," + body)  # deep, within the limit
        out.append(b'{"zz_skipped":"caf\xc3\xa9 \xe2\x80\x94",' + body)  # valid UTF-8
        out.append(b'{"type":"zz_unknown",' + body)  # a repeated key: the last one counts
        out.append(text[:-1] + b',"type":"zz_unknown"}')
        out.append(text[: len(text) // 2])  # truncated
    return b"\n".join(out) + b"\n"


def all_inputs() -> dict[str, tuple[str, bytes]]:
    inputs = fixture_inputs()
    inputs["bench rollout 4000 lines, seed 3"] = ("codex-rollout", bench_input())
    for name, (fmt, data) in list(inputs.items()):
        if fmt in ("codex-rollout", "claude-transcript") and not name.startswith("bench"):
            inputs[f"{name} mutated"] = (fmt, mutated(data, seed=len(name)))
    return inputs


def at_own_path(name: str) -> str | None:
    """For a Claude input, its fixture path as the parser's source: a subagent's file
    names its session and agent, which the rollout name every input is read as hides."""
    fixture = name.removesuffix(" mutated")
    return fixture if fixture.endswith(".jsonl") and "claude-transcript/" in fixture else None


def digests() -> dict[str, str]:
    out = {}
    for name, (fmt, data) in all_inputs().items():
        out[name] = parse_digest(fmt, data)
        if source := at_own_path(name):
            out[f"{name} at its path"] = parse_digest(fmt, data, source=source)
    return out


def test_every_input_parses_as_the_dict_reading_parsers_did():
    expected = json.loads(GOLDEN.read_text())
    actual = digests()
    assert actual.keys() == expected.keys()
    changed = sorted(name for name in expected if actual[name] != expected[name])
    assert not changed, changed


@pytest.mark.parametrize("fixture", ["codex-rollout/live-0.163-supervised.jsonl",
                                     "claude-transcript/7f3c2a10-5b4e-4d21-9c8a-1e2f3a4b5c6d.jsonl"])
def test_the_mutated_inputs_reach_every_odd_case(fixture):
    """The mutation corpus is no idle check: for each format it holds quarantined lines
    of each reason a typed decode could get wrong, and counted unknown types."""
    fmt, data = fixture_inputs()[fixture]
    parser = PARSERS[fmt](source="x.jsonl")
    reasons = {p.event.reason for p in parser.feed(mutated(data, seed=1)) if isinstance(p.event, Quarantined)}
    assert {"number_out_of_range", "invalid_utf8", "too_deep", "truncated", "wrong_type"} <= reasons
    assert parser.unknown_types


def test_claude_inputs_are_also_read_at_their_own_paths():
    """Read at its path, a mutated subagent file (lines whose ``sessionId`` or
    ``agentId`` was dropped or changed) takes the missing names from the path: the
    inputs at their paths are no copies of the inputs read under the rollout name."""
    inputs = all_inputs()
    subagents = [name for name in inputs if at_own_path(name) and "/subagents/" in name and name.endswith("mutated")]
    assert subagents
    for name in subagents:
        fmt, data = inputs[name]
        assert parse_digest(fmt, data, source=at_own_path(name)) != parse_digest(fmt, data), name


if __name__ == "__main__":
    json.dump(digests(), sys.stdout, indent=1, sort_keys=True)
    print()
