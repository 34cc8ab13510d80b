"""Redaction of app-server messages for ``--trace`` files: the same privacy as the
ledger, by allow-list.

What stays is the protocol's structure: the envelopes it nests (``params``, ``item``,
``turn``…) are walked, and in them ids, methods, types, statuses and other enumerated
values keep their strings, while numbers, flags and nulls (counts, times, exit codes)
stay as they are. Every other string, and every object or list the protocol does not
define (a tool's arguments, a diff, a file change, a search), is replaced by its digest
and size. A field the protocol adds later is therefore hidden until it is listed here:
a trace can lose detail, never leak text.
"""

from __future__ import annotations

import re
from typing import Any

from tillerman.monitor.digest import digest, size

#: Keys whose strings (or lists of strings) are kept: enumerations and names of the
#: protocol's own, never someone's words or paths.
KEPT_STRINGS = frozenset({
    "id", "method", "type", "status", "kind", "role", "phase", "activeFlags", "cliVersion", "threadSource",
    "source", "originator", "modelProvider", "model", "reasoningEffort", "effort", "approvalPolicy",
    "codexErrorInfo", "decision", "serviceTier", "summaryMode",
})
#: Ids and times: ``threadId``, ``clientUserMessageId``, ``requestIds``, ``createdAt``…
_KEPT_NAME = re.compile(r"(?:Id|Ids|At)$")
#: Keys whose objects and lists are the protocol's envelopes: walked, not digested.
WALKED = frozenset({
    "params", "result", "error", "item", "items", "turn", "turns", "thread", "data", "status", "initialTurnsPage",
    "content", "input", "changes", "kind", "action", "codexErrorInfo", "tokenUsage", "total", "last", "info", "rateLimits",
    "primary", "secondary", "capabilities", "clientInfo",
})

_REDACTED = re.compile(r"\[redacted sha256:[0-9a-f]{64} \d+ bytes\]")


def redact_message(value: Any) -> Any:
    """A copy of a decoded JSON message (or a frame's text) with only its structure
    left in clear; a message that is not an object is redacted whole."""
    return _walk(value) if isinstance(value, dict) else redacted(value)


def redacted(value: Any) -> str:
    """The stand-in for a value: its digest (canonical JSON for structures) and size."""
    return f"[redacted {digest(value)} {size(value)} bytes]"


def is_redacted(value: str) -> bool:
    return _REDACTED.fullmatch(value) is not None


def kept(key: str) -> bool:
    """Whether the strings under ``key`` stay in clear."""
    return key in KEPT_STRINGS or _KEPT_NAME.search(key) is not None


def _walk(node: dict) -> dict:
    return {key: _field(key, value) for key, value in node.items()}


def _field(key: str, value: Any) -> Any:
    if isinstance(value, str):
        return value if kept(key) else redacted(value)
    if isinstance(value, dict):
        return _walk(value) if key in WALKED else redacted(value)
    if isinstance(value, list):
        if kept(key) and all(isinstance(v, str | int | float | bool) or v is None for v in value):
            return value
        if key not in WALKED:
            return redacted(value)
        return [_walk(v) if isinstance(v, dict) else _field("", v) for v in value]
    return value  # a number, a flag or null
