"""Digests and sizes of payloads: the one place where privacy is decided.

Observations keep a SHA-256 digest and the byte size of a prompt, a tool's
arguments or its output, never the text itself. Text is kept only when the user
asked for it (``--retain-payloads``); every parser goes through ``Payload`` so
that switch cannot be forgotten in one format and honoured in another.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

_canonical = msgspec.json.Encoder(order="deterministic")


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    # Structured values (a tool's input object) are digested in canonical JSON,
    # so key order in the source does not change the digest.
    return _canonical.encode(value)


def digest(value: Any) -> str:
    """``sha256:<hex>`` of text, bytes, or (canonical JSON of) a structured value."""
    return "sha256:" + hashlib.sha256(_as_bytes(value)).hexdigest()


def size(value: Any) -> int:
    """Byte size of what ``digest`` hashes."""
    return len(_as_bytes(value))


def measure(value: Any) -> tuple[str, int]:
    """``(digest(value), size(value))``, encoding the value once."""
    data = _as_bytes(value)
    return "sha256:" + hashlib.sha256(data).hexdigest(), len(data)


class Payload(msgspec.Struct, frozen=True):
    digest: str
    size: int
    text: str | None  # None unless payloads are retained


def payload(text: str, *, retain: bool) -> Payload:
    return Payload(*measure(text), text if retain else None)


#: A retained command is cut to this many characters: enough to read what ran, while a
#: heredoc writing a whole file does not fill every row that records it.
COMMAND_LENGTH = 2000


def kept_command(command: str | None, *, retain: bool) -> str | msgspec.UnsetType:
    """A shell call's command as ``ItemStarted.command`` keeps it: only when payloads are
    retained, cut to ``COMMAND_LENGTH``; otherwise UNSET, which the ledger leaves out."""
    return command[:COMMAND_LENGTH] if retain and command else msgspec.UNSET
