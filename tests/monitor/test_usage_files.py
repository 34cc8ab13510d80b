"""The fast folder reader (``tillerman.monitor.usage_files``) gives the usage the full
parsers give: the same events under the same ids, threads and turns, and the same
quarantines for usage that cannot be counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tillerman.ledger.events import Quarantined, Usage, UsageReported
from tillerman.ledger.usage_account import UsageAccount
from tillerman.monitor.file_reader import FileReader
from tillerman.monitor.formats import PARSERS, detect_format
from tillerman.monitor.identity import file_identity, read_first_line
from tillerman.monitor.tailer import file_source
from tillerman.monitor.usage_files import (
    HEAD_BYTES,
    POOL_FROM,
    UsageFilesError,
    read_usage_file,
    read_usage_files,
    usage_file_paths,
)

SESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"
READ = ("codex-rollout", "claude-transcript")


def _format(path: Path) -> str | None:
    return detect_format(path.read_bytes()[:HEAD_BYTES], str(path))


FILES = [p for p in sorted(SESSIONS.rglob("*.jsonl")) if _format(p) in READ]


def _full(path: Path) -> list:
    """What replay's reader makes of the file: (id, event, at, offset, length) of its
    usage and usage_reported events, and (offset, reason) of its quarantines."""
    parser = PARSERS[_format(path)](source=file_source(path))
    reader = FileReader(str(path), parser, file_identity(path, read_first_line(path)), 1 << 20)
    events = [fe for _, chunk in reader.chunks() for fe in chunk]
    usage = [(fe.event_id, fe.event, fe.at, fe.offset, fe.length) for fe in events
             if isinstance(fe.event, Usage | UsageReported)]
    refused = {(fe.offset, fe.event.reason) for fe in events if isinstance(fe.event, Quarantined)}
    return [usage, refused]


def _fast(path: Path) -> list:
    found = read_usage_file(path)
    assert found is not None
    usage = [(e.event_id, e.event, e.at, e.offset, e.length) for e in found.envelopes
             if isinstance(e.event, Usage | UsageReported)]
    refused = {(e.offset, e.event.reason) for e in found.envelopes if isinstance(e.event, Quarantined)}
    return [usage, refused]


def test_the_fixtures_hold_usage_of_both_agents():
    kinds = {read_usage_file(p).kind for p in FILES if any(isinstance(e.event, Usage)
                                                            for e in read_usage_file(p).envelopes)}
    assert kinds == {"codex", "claude"}
    # Claude Code's own account (its cost-state line), after the calls and turns its exit ends.
    reported = [e for p in FILES for e in read_usage_file(p).envelopes if isinstance(e.event, UsageReported)]
    assert reported


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SESSIONS)))
def test_the_fast_reader_gives_the_full_parsers_usage(path):
    (full_usage, full_refused), (fast_usage, fast_refused) = _full(path), _fast(path)
    assert fast_usage == full_usage
    # Every line it refuses the parser refuses for the same reason; every usage the
    # parser refuses, it refuses (it reads only some lines, so not all of the parser's).
    assert fast_refused <= full_refused
    assert {(o, r) for o, r in full_refused if r.startswith("usage_")} <= fast_refused


def _spaced(line: bytes) -> bytes:
    """The line as JSON written with spaces after its colons and commas (Python's default);
    a line that is no JSON, as it is."""
    try:
        return json.dumps(json.loads(line)).encode()
    except ValueError:
        return line


@pytest.mark.parametrize("path", [p for p in FILES if any(isinstance(e.event, Usage | UsageReported)
                                                          for e in read_usage_file(p).envelopes)],
                         ids=lambda p: str(p.relative_to(SESSIONS)))
def test_lines_written_with_spaces_give_the_full_parsers_usage(tmp_path, path):
    spaced = tmp_path / path.relative_to(SESSIONS)  # the same name: a subagent's is told by its path
    spaced.parent.mkdir(parents=True)
    spaced.write_bytes(b"\n".join(_spaced(line) for line in path.read_bytes().split(b"\n")))
    assert b'"type": "' in spaced.read_bytes()
    (full_usage, full_refused), (fast_usage, fast_refused) = _full(spaced), _fast(spaced)
    assert len(fast_usage) == len(_fast(path)[0])  # every usage of the compact file, found
    assert fast_usage == full_usage
    assert fast_refused <= full_refused


def _codex_line(info: dict, kind: str = "token_count") -> dict:
    return {"timestamp": "2026-12-01T10:00:01Z", "type": "event_msg", "payload": {"type": kind, "info": info}}


def _figures(**kw) -> dict:
    figures = {"input_tokens": 100, "cached_input_tokens": 40, "output_tokens": 10, "reasoning_output_tokens": 2,
               "total_tokens": 110}
    return {**figures, **kw}


HOSTILE_CODEX = [
    {"timestamp": "2026-12-01T10:00:00Z", "type": "session_meta",
     "payload": {"id": "0199b000-0000-7000-8000-0000000000c1"}},
    {"timestamp": "2026-12-01T10:00:00Z", "type": "turn_context", "payload": {"turn_id": "t1", "model": "gpt-5"}},
    _codex_line({"total_token_usage": _figures(), "last_token_usage": _figures()}),
    _codex_line({"total_token_usage": _figures(), "last_token_usage": _figures(input_tokens=-5)}),
    _codex_line({"total_token_usage": _figures(), "last_token_usage": _figures(output_tokens="10")}),
    _codex_line({"total_token_usage": _figures(), "last_token_usage": _figures(input_tokens=10**12)}),
    _codex_line({"total_token_usage": _figures(), "last_token_usage": _figures(cached_input_tokens=500)}),
]


def _assistant(usage, *, line_id: str, **kw) -> dict:
    return {"type": "assistant", "sessionId": "s-1", "uuid": line_id, "timestamp": "2026-12-01T10:00:02Z",
            "requestId": f"req-{line_id}",
            "message": {"id": f"msg-{line_id}", "model": "claude-sonnet-4-5", "usage": usage,
                        "content": [{"type": "text", "text": "ok"}]}, **kw}


HOSTILE_CLAUDE = [
    {"type": "user", "sessionId": "s-1", "uuid": "u1", "timestamp": "2026-12-01T10:00:00Z",
     "message": {"role": "user", "content": "go"}},
    _assistant({"input_tokens": 3, "output_tokens": 7, "cache_read_input_tokens": 50}, line_id="a1"),
    _assistant({"input_tokens": -3, "output_tokens": 7}, line_id="a2"),
    _assistant({"input_tokens": 3.5, "output_tokens": 7}, line_id="a3"),
    _assistant({"input_tokens": 3}, line_id="a4"),
    _assistant({"input_tokens": 3, "output_tokens": 7}, line_id="a5", requestId=5),
]


@pytest.mark.parametrize("name, lines", [
    ("rollout-2026-12-01T10-00-00-0199b000-0000-7000-8000-0000000000c1.jsonl", HOSTILE_CODEX),
    ("s-1.jsonl", HOSTILE_CLAUDE),
])
def test_hostile_usage_is_quarantined_as_the_parser_does(tmp_path, name, lines):
    path = tmp_path / name
    # The last line holds the bytes the reader looks for, and is no JSON.
    body = "\n".join(json.dumps(line, separators=(",", ":")) for line in lines) + '\n{"type":"assistant" "token_count"\n'
    path.write_text(body)
    fast_usage, fast_refused = _fast(path)
    assert [u[1].tokens.input for u in fast_usage] == ([100] if "rollout" in name else [53])
    reasons = sorted(reason for _, reason in fast_refused)
    assert reasons == sorted(["usage_negative", "usage_not_integer", "usage_out_of_range", "usage_inconsistent",
                              "invalid_json"] if "rollout" in name else
                             ["usage_negative", "usage_not_integer", "usage_missing_field", "wrong_type",
                              "invalid_json"])
    assert [fast_usage, fast_refused] == _full(path)


def _claude_with(**kw) -> list[dict]:
    line = _assistant({"input_tokens": 3, "output_tokens": 7}, line_id="a1")
    for key, value in kw.items():
        (line["message"] if key in ("stop_reason", "content") else line)[key] = value
    return [HOSTILE_CLAUDE[0], line, HOSTILE_CLAUDE[1]]


def _codex_with(kind: str, **payload) -> list[dict]:
    return [{"timestamp": "2026-12-01T10:00:00Z", "type": kind, "payload": payload}, *HOSTILE_CODEX[:3]]


@pytest.mark.parametrize("name, lines", [
    ("s-1.jsonl", _claude_with(sessionId=5)),
    ("s-1.jsonl", _claude_with(agentId=[1], isSidechain=True)),
    ("s-1.jsonl", _claude_with(stop_reason=5)),
    ("s-1.jsonl", _claude_with(content=[{"type": "text", "text": 5}])),
    ("s-1.jsonl", [{"type": "system", "sessionId": "s-1", "timestamp": "2026-12-01T10:00:02Z", "subtype": 3}]),
    ("rollout-2026-12-01T10-00-00-0199b000-0000-7000-8000-0000000000c1.jsonl", _codex_with("session_meta", id=5)),
    ("rollout-2026-12-01T10-00-00-0199b000-0000-7000-8000-0000000000c1.jsonl", _codex_with("turn_context", model=5)),
], ids=["sessionId", "agentId", "stop_reason", "text", "subtype", "session_meta id", "turn_context model"])
def test_a_text_field_of_another_type_is_quarantined_as_the_parser_does(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    fast = _fast(path)
    assert "wrong_type" in {reason for _, reason in fast[1]}
    assert fast == _full(path)


def test_folders_are_searched_for_jsonl_in_sorted_order(tmp_path):
    (tmp_path / "b").mkdir()
    for name in ("b/2.jsonl", "a.jsonl", "b/1.jsonl", "notes.txt"):
        (tmp_path / name).write_text("{}\n")
    assert [p.relative_to(tmp_path).as_posix() for p in usage_file_paths([str(tmp_path)])] == [
        "a.jsonl", "b/1.jsonl", "b/2.jsonl"]
    with pytest.raises(UsageFilesError, match="no such file or folder"):
        usage_file_paths([str(tmp_path / "missing")])


def test_a_file_of_another_format_is_named_not_read(tmp_path):
    other = SESSIONS / "codex-exec" / "stops-mid-turn.jsonl"
    assert list(read_usage_files([other])) == [str(other)]


def _many_files(root: Path) -> list[Path]:
    """More files than the readers are forked for: the recorded sessions, several times over."""
    for copy in range(6):
        for path in FILES:
            target = root / str(copy) / path.relative_to(SESSIONS)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
    found = usage_file_paths([str(root)])
    assert len(found) >= POOL_FROM
    return found


def test_forked_readers_give_what_one_process_reads(tmp_path):
    paths = _many_files(tmp_path)
    alone = list(read_usage_files(paths, jobs=1))
    assert list(read_usage_files(paths, jobs=2)) == alone
    assert list(read_usage_files(paths, jobs=3)) == alone
    assert sum(len(found.envelopes) for found in alone if not isinstance(found, str)) > 100


def test_a_file_a_forked_reader_cannot_read_is_an_error_here(tmp_path):
    paths = _many_files(tmp_path)
    paths[-1].unlink()  # gone between the listing and the reading
    with pytest.raises(FileNotFoundError) as raised:
        list(read_usage_files(paths, jobs=2))
    assert raised.value.filename == str(paths[-1])


@pytest.mark.parametrize("chunk", [1, 100, 4096])
def test_a_file_is_read_in_chunks_with_the_same_result(monkeypatch, chunk):
    """Memory stays flat: a file is read a chunk at a time, and a line cut by a chunk's end
    is read whole with the next."""
    import tillerman.monitor.usage_files as usage_files

    whole = {path: _fast(path) for path in FILES}
    monkeypatch.setattr(usage_files, "CHUNK", chunk)
    assert {path: _fast(path) for path in FILES} == whole


def test_progress_is_told_after_each_file(tmp_path):
    paths = _many_files(tmp_path)
    told: list[tuple[int, int]] = []
    list(read_usage_files(paths, lambda done, total: told.append((done, total)), jobs=2))
    assert told == [(n, len(paths)) for n in range(1, len(paths) + 1)]


def test_a_rollout_whose_name_and_session_meta_name_no_thread_is_a_thread_named_by_its_file():
    """ccusage's branch-history rollouts: no id in the name, no session_meta. Each is a
    thread of its own under its file's name (both readers), so the two files' counters
    are checked each against its own, where one thread with no id saw the parent's counter
    go back after the branch's (a false counter_reset)."""
    paths = [SESSIONS / "public" / "codex-rollout" / f"ccusage-branch-history-{name}.jsonl"
             for name in ("branch", "parent")]
    for path in paths:
        full, fast = _full(path)[0], _fast(path)[0]
        assert {event.thread_id for _, event, *_ in full} == {event.thread_id for _, event, *_ in fast} == {path.stem}
    read = [found for found in read_usage_files(paths) if found is not None]
    account = UsageAccount().add_all(envelope for found in read for envelope in found.envelopes)
    assert list(account.mismatches()) == []
    assert account.thread("ccusage-branch-history-parent").tokens.input == 1000
