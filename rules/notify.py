"""``[[notify]]`` sinks: where notices for people go, and which ones.

A sink is a command (the notice group as JSON on stdin) or a webhook (the same JSON
POSTed). A webhook's host must be this machine unless the table says
``allow_remote = true``: notices name threads and intents, and a typo in a URL must
not send them elsewhere. ``tillerman.controller.notify.notices`` decides what each sink is sent
and when; ``tillerman.controller.notify.sinks`` sends it.
"""

from __future__ import annotations

import ipaddress
from typing import Literal
from urllib.parse import urlsplit

import msgspec

from tillerman.rules.errors import show

NoticeKind = Literal["overdue", "escalation", "report", "goal", "usage"]
NOTICE_KINDS: tuple[NoticeKind, ...] = ("overdue", "escalation", "report", "goal", "usage")


class NotifySink(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    command: tuple[str, ...] | None = None  # argv, no shell
    shell: str | None = None  # --on-overdue: a shell command line, as the option always took
    webhook: str | None = None
    group_window: float = 10.0  # seconds: notices of one thread within it go in one hand-over
    repeat: float | None = None  # seconds: an unresolved notice is sent again this often; None: once
    kinds: tuple[NoticeKind, ...] = NOTICE_KINDS
    timeout: float = 10.0  # one attempt's limit; a hanging sink is stopped and retried later
    # --on-overdue: one notice per hand-over, the notice itself as the JSON (its long-standing shape)
    per_notice: bool = False


def check_webhook(url: str, allow_remote: bool) -> str:
    """``url`` when it is an http(s) URL on this machine (or ``allow_remote``); else
    ``ValueError`` saying what to write."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"invalid webhook {show(url)}; write an http:// or https:// URL, "
                         'e.g. webhook = "http://127.0.0.1:9000/tillerman"')
    if not allow_remote and not is_loopback(parts.hostname):
        raise ValueError(f"webhook {show(url)} is not on this machine; notices name your threads and intents:"
                         " add allow_remote = true if that host is meant, or use a loopback URL")
    return url


def check_dashboard_url(url: str) -> str:
    """The dashboard's address as notices link to it (``[dashboard] url``): an http(s)
    URL with a host and no credentials, query or fragment, since a link in a notice
    travels to a phone or a chat and the page's secret belongs in its cookie, never in
    an address. ``ValueError`` saying what to write."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f'invalid dashboard url {show(url)}; write the address tillerman dashboard prints,'
                         ' without its ?token=, e.g. url = "http://127.0.0.1:8765/d/PREFIX/"')
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ValueError(f"dashboard url {show(url)} carries credentials, a query or a fragment; notices"
                         " would hand them on: write only scheme, host, port and path (the page's secret"
                         " is kept in its cookie)")
    return url


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
