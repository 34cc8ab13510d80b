"""Which files replay together: the threads a file's opening names, and the grouping."""

import json
from pathlib import Path

from tillerman.controller.replay.groups import ReplayFile, group_files
from tillerman.monitor.file_threads import file_threads

SESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"
PARENT = "0199b000-0000-7000-8000-00000000bb01"
FORK = "0199b000-0000-7000-8000-00000000bb02"
CHILD = "0199b000-0000-7000-8000-00000000bb03"


def meta(thread: str, **fields) -> bytes:
    payload = {"id": thread, "cwd": "/w", **fields}
    return json.dumps({"timestamp": "2026-10-19T22:00:00.000Z", "type": "session_meta", "payload": payload}).encode() + b"\n"


def rollout_path(thread: str) -> str:
    return f"/s/2026/10/19/rollout-2026-10-19T22-00-00-{thread}.jsonl"


def test_a_rollout_names_its_thread_and_the_thread_it_was_forked_from():
    assert file_threads("codex-rollout", meta(PARENT), rollout_path(PARENT)) == {PARENT}
    assert file_threads("codex-rollout", meta(FORK, forked_from_id=PARENT), rollout_path(FORK)) == {FORK, PARENT}


def test_a_spawned_subagent_rollout_names_its_parent():
    spawned = meta(CHILD, source={"subagent": {"thread_spawn": {"parent_thread_id": PARENT, "depth": 1}}})
    assert file_threads("codex-rollout", spawned, "/any/name.jsonl") == {CHILD, PARENT}


def test_a_session_meta_longer_than_the_opening_still_names_its_parent():
    """The first line is cut (long base instructions): the name gives the thread, the
    field found by name the parent."""
    cut = meta(FORK, forked_from_id=PARENT, base_instructions="x" * 100_000)[:65536]
    assert file_threads("codex-rollout", cut, rollout_path(FORK)) == {FORK, PARENT}


def test_a_claude_transcript_and_its_subagent_file_name_one_session():
    session = "7f3c2a10-5b4e-4d21-9c8a-1e2f3a4b5c6d"
    main = SESSIONS / "claude-transcript" / f"{session}.jsonl"
    agent = SESSIONS / "claude-transcript" / session / "subagents" / "agent-a2898e3.jsonl"
    for path in (main, agent):
        assert file_threads("claude-transcript", path.read_bytes()[:65536], str(path)) == {session}


def test_codex_exec_output_names_the_thread_it_starts():
    head = b'{"type":"thread.started","thread_id":"t-1"}\n{"type":"turn.started"}\n'
    assert file_threads("codex-exec", head, "x.jsonl") == {"t-1"}


def test_formats_that_name_threads_only_deep_inside_name_none_and_bad_openings_do_not_raise():
    assert file_threads("codex-tui", b'{"ts":"x","dir":"meta","kind":"session_start"}\n', "t.jsonl") == set()
    assert file_threads(None, b"\x00\x01", "x.db") == set()
    assert file_threads("codex-rollout", b'{"type":"session_meta","payload":{"id":7,"source":"cli"}}\n', "r.jsonl") == set()
    assert file_threads("claude-transcript", b"[1,2]\nnot json\n", "c.jsonl") == set()


def file(name: str, *threads: str, identity: str | None = None) -> ReplayFile:
    return ReplayFile(name, identity or name, frozenset(threads))


def test_files_sharing_a_thread_are_one_group_unrelated_files_their_own():
    files = [file("a", "A"), file("b", "B"), file("a-fork", "A2", "A"), file("log"), file("c", "C")]
    assert group_files(files) == [[0, 2], [1], [3], [4]]


def test_families_join_through_any_member_in_any_order():
    """A grandchild named first, its grandparent last: the parent links them."""
    files = [file("grandchild", "C", "B"), file("other", "X"), file("grandparent", "A"), file("parent", "B", "A")]
    assert group_files(files) == [[0, 2, 3], [1]]


def test_one_file_named_twice_is_one_group():
    files = [file("./x.log", identity="1:7"), file("y.log", identity="1:8"), file("x.log", identity="1:7")]
    assert group_files(files) == [[0, 2], [1]]


def test_no_files_no_groups():
    assert group_files([]) == []


def test_a_claude_sessions_transcript_stdout_and_hook_payloads_name_one_session():
    hooks = SESSIONS / "claude-live" / "hooks"
    named = {fmt: file_threads(fmt, (hooks / name).read_bytes()[:65536], str(hooks / name))
             for name, fmt in (("transcript.jsonl", "claude-transcript"), ("stdout.jsonl", "claude-stream-json"),
                               ("hooks.jsonl", "claude-hooks"))}
    [session] = named["claude-transcript"]
    assert named == {fmt: {session} for fmt in named}
