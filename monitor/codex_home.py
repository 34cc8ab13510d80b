"""Where a user's Codex lives, and which app-server ``tillerman run`` attaches to.

Codex keeps its state in ``$CODEX_HOME`` (default ``~/.codex``). Its shared background
server — ``codex app-server daemon start``, or the one plain ``codex`` starts or joins —
listens on the control socket ``$CODEX_HOME/app-server-control/app-server-control.sock``,
and ``unix://`` with no path means that socket to Codex itself. tillerman follows the
same convention, so a bare ``tillerman run`` supervises the sessions the user's own
Codex TUI runs.

The first client to ``initialize`` a shared server names the ``originator`` of every
thread it creates afterwards. On the user's own shared server tillerman must not brand
the user's threads, so there it initializes with the name the TUI itself sends.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

import msgspec

CONTROL_SOCKET = Path("app-server-control") / "app-server-control.sock"
#: ``clientInfo.name`` of Codex's interactive TUI (reference: codex-tui.md §1.1).
TUI_CLIENT_NAME = "codex-tui"
#: Our own name, where no harness's threads can be branded by it (a server we spawned).
OWN_CLIENT_NAME = "tillerman"
START_HINT = "start Codex's shared server with `codex app-server daemon start` (or just run `codex`)"


class TargetError(ValueError):
    """An app-server URL tillerman cannot attach to, with what to write instead."""


class Target(msgspec.Struct, frozen=True):
    """The app-server to attach to, and the name to initialize with."""

    url: str
    client_name: str
    default_socket: bool  # Codex's own shared server (the user's TUI may use it)
    remote: bool = False  # a ws:// host that is not this machine's loopback


def codex_home(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get("CODEX_HOME") or Path.home() / ".codex").absolute()


def control_socket(environ: dict[str, str] | None = None) -> Path:
    return codex_home(environ) / CONTROL_SOCKET


def resolve_target(url: str | None, client_name: str | None,
                   environ: dict[str, str] | None = None) -> Target:
    """``None`` or ``unix://`` → Codex's control socket (CODEX_HOME honoured); a
    relative ``unix://PATH`` is made absolute here, at the edge. Without an explicit
    ``client_name``, the default socket gets the TUI's name and anything else ours."""
    remote = False
    if url is None or url == "unix://":
        target = f"unix://{control_socket(environ)}"
    elif url.startswith("unix://"):
        if "\x00" in url:
            raise TargetError(f"--codex {url!r}: a socket path cannot contain a NUL character")
        target = f"unix://{Path(url.removeprefix('unix://')).absolute()}"
    elif url.startswith(("ws://", "wss://")):
        target, remote = url, not is_loopback(_ws_host(url))
    else:
        raise TargetError(f"--codex {url!r} is not an app-server URL; write unix://PATH or ws://HOST:PORT")
    default = target == f"unix://{control_socket(environ)}"
    name = client_name or (TUI_CLIENT_NAME if default else OWN_CLIENT_NAME)
    return Target(url=target, client_name=name, default_socket=default, remote=remote)


def _ws_host(url: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port that is not a number in range)
    except ValueError as exc:
        raise TargetError(f"--codex {url!r}: {exc}; write ws://HOST:PORT") from None
    if not parts.hostname:
        raise TargetError(f"--codex {url!r} names no host; write ws://HOST:PORT")
    return parts.hostname


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine over loopback: ``localhost`` or a loopback address
    (a name is not resolved: a DNS answer is not proof that the host is this one)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
