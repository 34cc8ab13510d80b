"""The dashboard's secret, kept in a file so that the printed URL, bookmarks and the
links of notices (``[dashboard] url`` holds a path derived from it) outlive a restart.

The file is the owner's alone (0600): anyone who reads it can act as the owner on the
page. One that others may read is refused, not silently tightened: it may have been
read already, and ``--new-secret`` is the way to a fresh one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tillerman.controller.dashboard.guard import new_secret


def default_path() -> Path:
    """Beside the default ledger: ``$XDG_STATE_HOME/tillerman/dashboard-secret``."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "tillerman" / "dashboard-secret"


class SecretFileError(ValueError):
    """A secret file that cannot be used, with what to do."""


def load(path: Path, *, rotate: bool = False) -> str:
    """The secret in ``path``, created (0600, its folder 0700 when made) when absent or
    when ``rotate``."""
    if rotate or not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        secret = new_secret()
        temporary = path.with_name(path.name + ".new")
        temporary.unlink(missing_ok=True)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secret + "\n")
        os.replace(temporary, path)  # a reader sees the old secret or the new one, never half
        return secret
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretFileError(f"dashboard secret {path} may be read by others (mode {stat.S_IMODE(mode):o});"
                              f" run chmod 600 {path} and add --new-secret, since it may have been read")
    secret = path.read_text().strip()
    if not secret:
        raise SecretFileError(f"dashboard secret {path} is empty; add --new-secret to write a new one")
    return secret
