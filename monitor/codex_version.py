"""What the app-server's ``initialize`` answer says about the server.

Its ``userAgent`` reads ``<originator>/<version> (<os>; <arch>) <terminal> (<client>; <client
version>)``: the first name is the client that initialized the server process first,
which every thread created since carries as its ``originator``, and the version is the
server's own.
"""

from __future__ import annotations

import re

_HEAD = re.compile(r"^\s*([^/\s]+)/([0-9][^\s]*)")


def parse_user_agent(user_agent: str | None) -> tuple[str | None, str | None]:
    """(originator, server version); None for a part the string does not hold."""
    match = _HEAD.match(user_agent or "")
    return (match.group(1), match.group(2)) if match else (None, None)
