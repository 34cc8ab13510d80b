"""The local owner: who runs tillerman here, and the grant that owner holds by default.

The owner is the login name of the effective uid, from the password database, not
``$USER``: containers and services often leave ``$USER`` unset (or set it to someone
else's name), while the uid is what the process really runs as. A uid with no entry
(a container started with ``--user 12345``) is named ``uid12345``.
"""

from __future__ import annotations

import os
import pwd

from tillerman.rules.ruleset import ANY, Grant

OWNER_PREFIX = "owner:"
#: What the local owner may do on every thread without any configuration. Interrupts
#: stay behind an explicit grant: stopping a turn throws work away.
OWNER_ACTIONS = frozenset({"steer", "queue"})


def local_login() -> str:
    """The login name of the effective uid, or ``uid<N>`` when it has none."""
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = ""
    return name or f"uid{uid}"


def owner_grant(login: str | None = None) -> Grant:
    """The built-in grant: ``owner:<login>`` may steer and queue on every thread."""
    return Grant(subject=OWNER_PREFIX + (login or local_login()), actions=OWNER_ACTIONS, threads=ANY, builtin=True)
