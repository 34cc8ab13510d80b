"""Redaction of app-server messages for ``--trace`` files: the same privacy as the
ledger. Ids, types, statuses, times and sizes stay; the text of prompts, commands,
tool arguments and outputs is replaced by its digest and size."""

from __future__ import annotations

from typing import Any

from monitor.digest import digest

#: Keys whose string values are someone's words or a tool's payload.
SENSITIVE_KEYS = frozenset({
    "text", "command", "cmd", "arguments", "output", "aggregatedOutput", "aggregated_output", "delta",
    "message", "reason", "justification", "summary", "content", "last_agent_message", "preview",
    "instructions", "stdout", "stderr", "formattedOutput",
})


def redact_message(value: Any) -> Any:
    """A copy of a decoded JSON message with every sensitive string replaced."""
    if isinstance(value, dict):
        return {k: (_redacted(v) if k in SENSITIVE_KEYS and isinstance(v, str) else redact_message(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact_message(v) for v in value]
    return value


def _redacted(text: str) -> str:
    return f"[redacted {digest(text)} {len(text.encode('utf-8'))} bytes]"
