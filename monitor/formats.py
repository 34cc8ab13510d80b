"""The format registry and auto-detection.

``detect_format(head, path)`` looks at the first bytes of a file (its first
complete record when there is one) and at the path; ``None`` when nothing fits.
``layout_note(head)`` then says in one line what such a file is, when it is a layout
people commonly have that no format reads.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping

import msgspec

from tillerman.monitor.lines import decode_json
from tillerman.monitor.parser import Parser


class _Parsers(Mapping[str, type[Parser]]):
    """Each format's parser by name, its module imported when the format is first asked
    for: a replay of Codex rollouts never imports the Claude or trace parsers."""

    def __init__(self, where: dict[str, str]) -> None:
        self._where = where  # format -> "module:class"

    def __getitem__(self, name: str) -> type[Parser]:
        module, cls = self._where[name].split(":")
        return getattr(importlib.import_module(module), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


PARSERS: Mapping[str, type[Parser]] = _Parsers({
    "codex-rollout": "tillerman.monitor.codex_rollout:CodexRolloutParser",
    "codex-exec": "tillerman.monitor.codex_exec:CodexExecParser",
    "codex-tui": "tillerman.monitor.codex_tui:CodexTuiParser",
    "claude-transcript": "tillerman.monitor.claude_transcript:ClaudeTranscriptParser",
    "claude-stream-json": "tillerman.monitor.claude_stream:ClaudeStreamParser",
    "claude-hooks": "tillerman.monitor.claude_hooks:ClaudeHooksParser",
    "claude-hook-log": "tillerman.monitor.claude_hook_log:ClaudeHookLogParser",
    "appserver-trace": "tillerman.monitor.appserver_trace:AppServerTraceParser",
})

_ROLLOUT_TYPES = frozenset({"session_meta", "turn_context", "response_item", "event_msg", "compacted",
                            "world_state", "token_usage_record"})
_CLAUDE_TYPES = frozenset({"user", "assistant", "system", "summary", "progress", "queue-operation",
                           "file-history-snapshot", "attachment", "last-prompt"})
# Lines only Claude Code's stream-json output has; its user/assistant/system lines name
# the session as ``session_id`` where a transcript says ``sessionId``.
_STREAM_TYPES = frozenset({"command_lifecycle", "result", "control_request", "control_response",
                           "control_cancel_request", "stream_event"})
_SUBAGENT_PATH = re.compile(r"[/\\]subagents[/\\]agent-[^/\\]+\.jsonl$")
_ROLLOUT_PATH = re.compile(r"(?:^|[/\\])rollout-[^/\\]*\.jsonl$")
# For a first line too long to be in ``head`` (a Claude api-request-blob, a large
# session_meta), the opening of the line still names its kind.
_HEAD_PATTERNS = (
    (re.compile(rb'"type"\s*:\s*"session_meta"'), "codex-rollout"),
    (re.compile(rb'"dir"\s*:\s*"(?:meta|to_tui|from_tui)"'), "codex-tui"),
    (re.compile(rb'"dir"\s*:\s*"(?:in|out)"\s*,\s*"msg"'), "appserver-trace"),
    (re.compile(rb'"sessionId"\s*:'), "claude-transcript"),
    (re.compile(rb'"hook_event_name"\s*:'), "claude-hooks"),
    (re.compile(rb'"type"\s*:\s*"(?:command_lifecycle|result|control_request)"'), "claude-stream-json"),
)


def parser_for(name: str) -> type[Parser]:
    return PARSERS[name]


# A hook-logging script's line: the payload's fields (or the payload, under
# ``payload``) wrapped with the hook's name and the time it ran.
_HOOK_LOG_TIMES = ("ts", "timestamp")
_HOOK_FIELDS = ("hook_event_name", "session_id")


def detect_format(head: bytes, path: str = "") -> str | None:
    if _SUBAGENT_PATH.search(path):
        return "claude-transcript"
    if _json_array(head):
        return _format_of_path(path)  # no line of it is a record: only a file's name can still tell
    for line in head.split(b"\n")[:-1] or [head]:
        record = _record(line)
        name = _format_of(record) if record is not None else None
        if name is not None:
            return name
    for pattern, name in _HEAD_PATTERNS:
        if pattern.search(head):
            return name
    return _format_of_path(path)


def layout_note(head: bytes) -> str | None:
    """What a file no format reads is, in one line, when it is a layout people commonly
    have: a JSON array of Claude Code hook payloads, as hook-logging scripts keep one
    file per hook type (``pre_tool_use.json``, ``stop.json``, ...)."""
    if not _json_array(head):
        return None
    if re.search(rb'"hook_event_name"\s*:', head):
        return ("a JSON array of Claude Code hook payloads (one file per hook type, as hook-logging scripts keep"
                " them), which cannot be replayed as a session: the payloads carry no times to put the files'"
                " records in order, and each file alone holds one hook's history; record hooks with"
                " `tillerman hooks install --claude`, or log one JSON object a line with a time")
    return "a JSON array, not JSON lines: tillerman reads one JSON object a line"


def _json_array(head: bytes) -> bool:
    """A JSON array spread over lines (pretty-printed), where a format's records are one
    object a line: its first line opens an array it does not close. Told from the first
    line alone, so more bytes never change the answer."""
    first, newline, _ = head.lstrip().partition(b"\n")
    if not newline or not first.startswith(b"["):
        return False
    try:
        decode_json(first)
    except msgspec.DecodeError:
        return True
    return False  # a whole value on one line: a bad line of a JSON-lines file


def _record(line: bytes) -> dict | None:
    if not line.strip():
        return None
    try:
        value = decode_json(line)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None


def _format_of(record: dict) -> str | None:
    kind = record.get("type")
    if "dir" in record and "kind" in record:
        return "codex-tui"
    if "dir" in record and "msg" in record:
        return "appserver-trace"
    if kind in _ROLLOUT_TYPES and "payload" in record:
        return "codex-rollout"
    if isinstance(kind, str) and (kind.split(".")[0] in ("thread", "turn", "item") and "." in kind):
        return "codex-exec"
    if _hook_log(record):
        return "claude-hook-log"
    if "hook_event_name" in record:
        return "claude-hooks"
    if kind in _STREAM_TYPES or ("session_id" in record and "sessionId" not in record and kind in _CLAUDE_TYPES):
        return "claude-stream-json"
    if kind in _CLAUDE_TYPES or "sessionId" in record:
        return "claude-transcript"
    return None


def _hook_log(record: dict) -> bool:
    """A hook payload as a logging script wraps it (``claude_hook_log``): a time, and the
    hook's name beside the payload's fields or the payload under ``payload``."""
    if "type" in record or not any(key in record for key in _HOOK_LOG_TIMES):
        return False  # every other format's records with a time have a type
    inner = record.get("payload")
    if isinstance(inner, dict):
        return any(key in inner for key in _HOOK_FIELDS)
    return "hook_event_name" in record or isinstance(record.get("event"), str) and "session_id" in record


def _format_of_path(path: str) -> str | None:
    return "codex-rollout" if _ROLLOUT_PATH.search(path) else None
