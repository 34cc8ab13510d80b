"""Which threads a session file belongs to, told from its path and opening bytes alone.

Replay keeps the files of one thread family together (``tillerman.controller.replay.groups``):

- a Codex rollout (``rollout-<ts>-<threadId>.jsonl``) names its thread in its name and
  in ``session_meta.payload.id``, and a fork or a spawned subagent names its parent
  (``forked_from_id``, ``parent_thread_id``, ``source.subagent.thread_spawn``);
- a Claude Code transcript names its session in every line (``sessionId``), and a
  2.1.x subagent file lives under it (``<sessionId>/subagents/agent-<id>.jsonl``);
- ``codex exec --json`` output opens with ``thread.started{thread_id}``;
- Claude Code's stream-json output and hook payloads name their session in every line
  (``session_id``; a hook log's lines may hold the payload under ``payload``).

Formats whose threads are named only deep inside (a TUI log, an app-server trace, a
ledger) name none here. Pure: no I/O, the caller reads the opening.
"""

from __future__ import annotations

import re

import msgspec

from tillerman.monitor.lines import decode_json

# A ``session_meta`` line longer than the opening (long base instructions) is cut: its
# parent is still found by name.
_PARENT_FIELD = re.compile(rb'"(?:forked_from_id|parent_thread_id)"\s*:\s*"([^"\\]{1,200})"')


def file_threads(fmt: str | None, head: bytes, path: str) -> frozenset[str]:
    """The thread ids the file at ``path`` (format ``fmt``, opening ``head``) names for
    itself and its parent; empty when its opening names none."""
    reader = _READERS.get(fmt or "")
    return frozenset(reader(head, path)) if reader else frozenset()


def _rollout(head: bytes, path: str) -> set[str]:
    from tillerman.monitor.codex_rollout import THREAD_FROM_PATH  # each format's parser only when its files are read

    found = THREAD_FROM_PATH.search(path)
    ids = {found.group(1)} if found else set()
    first = _first_record(head)
    if first is None:
        ids.update(m.decode() for m in _PARENT_FIELD.findall(head.split(b"\n", 1)[0]))
        return ids
    if first.get("type") == "session_meta":
        named = (("payload", "id"), ("payload", "forked_from_id"), ("payload", "parent_thread_id"),
                 ("payload", "source", "subagent", "thread_spawn", "parent_thread_id"))
        ids.update(filter(None, (_text_at(first, *keys) for keys in named)))
    return ids


def _claude(head: bytes, path: str) -> set[str]:
    from tillerman.monitor.claude_transcript import SUBAGENT_FILE

    found = SUBAGENT_FILE.search(path)
    ids = {found.group(1)} if found else set()
    session = next(filter(None, (_text_at(record, "sessionId") for record in _records(head))), None)
    return ids | {session} if session else ids


def _exec(head: bytes, path: str) -> set[str]:
    first = _first_record(head)
    thread = _text_at(first, "thread_id") if first is not None and first.get("type") == "thread.started" else None
    return {thread} if thread else set()


def _claude_session(head: bytes, path: str) -> set[str]:
    found = (_text_at(record, "session_id") or _text_at(record, "payload", "session_id") for record in _records(head))
    session = next(filter(None, found), None)
    return {session} if session else set()


_READERS = {"codex-rollout": _rollout, "claude-transcript": _claude, "codex-exec": _exec,
            "claude-stream-json": _claude_session, "claude-hooks": _claude_session,
            "claude-hook-log": _claude_session}


def _records(head: bytes):
    """The complete JSON-object lines of the opening (a cut last line is left out)."""
    for line in head.split(b"\n")[:-1]:
        if not line.strip():
            continue
        try:
            value = decode_json(line)
        except msgspec.DecodeError:
            continue
        if isinstance(value, dict):
            yield value


def _first_record(head: bytes) -> dict | None:
    line = head.split(b"\n", 1)
    if len(line) < 2:
        return None  # the first line is longer than the opening
    try:
        value = decode_json(line[0])
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None


def _text_at(value, *keys: str) -> str | None:
    """The non-empty string at the path of ``keys``; None for anything else (grouping
    reads leniently: the parser reports a bad line, not this)."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) and value else None
