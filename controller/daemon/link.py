"""The daemon's connection to the app-server, as ``tillerman status`` shows it.

The daemon runs whether or not the server is up: files are followed, heartbeats
written and overdue intents reported while it keeps trying. This records what a
person asks of it then — connecting to what, since when, why the last try failed —
and, once attached, who initialized the server first (the ``originator`` every new
thread is branded with) and the server's version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tillerman.monitor.appserver_info import server_identity
from tillerman.monitor.codex_home import START_HINT

#: Snapshot name of the daemon's heartbeat record, which carries ``Link.as_dict()`` and
#: which ``tillerman status`` reads (here, so status need not import the daemon).
HEARTBEAT = "daemon"


@dataclass
class Link:
    url: str | None
    client_name: str
    default_socket: bool
    since: float | None = None  # of the current state: connecting or connected
    connected: bool = False
    error: str | None = None  # why the last attempt failed; None once attached
    server_version: str | None = None
    originator: str | None = None

    def up(self, initialize_result: Any, now: float) -> None:
        identity = server_identity(initialize_result)
        self.server_version, self.originator = identity.version, identity.originator
        self.connected, self.error, self.since = True, None, now

    def failed(self, reason: str, now: float, *, nothing_listens: bool) -> str:
        """Record a failed or lost connection; the one line to log for it."""
        if self.connected or self.since is None:
            self.since = now
        self.connected, self.error = False, reason
        if self.default_socket and nothing_listens:
            return (f"no Codex app-server at {self.url} ({reason}): {START_HINT}; retrying meanwhile,"
                    " and following files, reporting overdue intents")
        return f"cannot reach the app-server at {self.url}: {reason}; retrying"

    @property
    def first_initializer(self) -> bool | None:
        """Whether tillerman initialized the server first (and so branded every thread
        created since): False when another name is the originator; None when the
        originator is the name tillerman also used, which cannot tell who came first."""
        if self.originator is None:
            return None
        if self.originator != self.client_name:
            return False
        return None if self.default_socket else True

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "connected": self.connected, "client_name": self.client_name,
                "since": self.since, "error": self.error, "server_version": self.server_version,
                "originator": self.originator, "initialized_first": self.first_initializer}

