"""The format registry and auto-detection.

``detect_format(head, path)`` looks at the first bytes of a file (its first
complete record when there is one) and at the path; ``None`` when nothing fits.
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


def detect_format(head: bytes, path: str = "") -> str | None:
    if _SUBAGENT_PATH.search(path):
        return "claude-transcript"
    for line in head.split(b"\n")[:-1] or [head]:
        record = _record(line)
        name = _format_of(record) if record is not None else None
        if name is not None:
            return name
    for pattern, name in _HEAD_PATTERNS:
        if pattern.search(head):
            return name
    return _format_of_path(path)


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
    if "hook_event_name" in record:
        return "claude-hooks"
    if kind in _STREAM_TYPES or ("session_id" in record and "sessionId" not in record and kind in _CLAUDE_TYPES):
        return "claude-stream-json"
    if kind in _CLAUDE_TYPES or "sessionId" in record:
        return "claude-transcript"
    return None


def _format_of_path(path: str) -> str | None:
    return "codex-rollout" if _ROLLOUT_PATH.search(path) else None
