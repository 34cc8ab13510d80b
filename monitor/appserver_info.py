"""What a client can tell about the app-server it talks to, as text for a person.

`server_identity` reads the ``initialize`` result: its ``userAgent`` is
``"<originator>/<version> (<os>; <arch>) <terminal> (<own client name>; <own version>)"``
(0.149.0 to 0.163.0 alike), where the originator is the ``clientInfo.name`` of the first
connection that initialized on that server: it brands every thread created afterwards.

`describe_failure` turns a failed connect, handshake or request into one line: the
server's HTTP answer and body when it sent one, each chained cause (a retry loop's
timeout hides the refusal it kept getting), the exception type when a message is
empty, and the server version when it is known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from websockets.exceptions import InvalidStatus

_USER_AGENT = re.compile(r"(?P<originator>[^/\s]+)/(?P<version>\d+\.\d+\.\d+\S*)(?:\s|$)")
_BODY_CHARS = 200  # of a refusal's body: enough for a reason, never a whole error page
_CHAIN_DEPTH = 4


@dataclass(frozen=True)
class ServerIdentity:
    version: str | None = None  # e.g. "0.163.0"
    originator: str | None = None  # the first initializer's client name


def server_identity(initialize_result: object) -> ServerIdentity:
    """The server's version and originator from an ``initialize`` result; unknown
    fields are None (an older or newer server may word its userAgent differently)."""
    user_agent = initialize_result.get("userAgent") if isinstance(initialize_result, dict) else None
    match = _USER_AGENT.match(user_agent) if isinstance(user_agent, str) else None
    if match is None:
        return ServerIdentity()
    return ServerIdentity(version=match["version"], originator=match["originator"])


def describe_failure(exc: BaseException, server_version: str | None = None) -> str:
    """One line saying why a connection or a request to the app-server failed."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < _CHAIN_DEPTH:
        seen.add(id(current))
        parts.append(_one(current))
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    line = ": ".join(parts)
    return f"{line} (server {server_version})" if server_version else line


def _one(exc: BaseException) -> str:
    if isinstance(exc, InvalidStatus):
        response = exc.response
        answer = f"server answered HTTP {response.status_code} {response.reason_phrase}".rstrip()
        body = " ".join(response.body.decode("utf-8", "replace").split()) if response.body else ""
        if len(body) > _BODY_CHARS:
            body = body[:_BODY_CHARS] + "…"
        return f"{answer}: {body}" if body else answer
    text = " ".join(str(exc).split())  # one line, whatever the message held
    return text or type(exc).__name__
