"""The dashboard's secret, kept in a file so that the printed URL, bookmarks and the
links of notices (``[dashboard] url`` holds a path derived from it) outlive a restart.

The file is the owner's alone (0600): anyone who reads it can act as the owner on the
page. One that others may read is refused, not silently tightened: it may have been
read already, and ``--new-secret`` is the way to a fresh one. It opens with ``MARK``,
so that ``--secret-file`` pointed at anything else — a person's file, the ledger, a
device — is refused before it is read as a secret or replaced by one (the safe output
rule, ``tillerman.ledger.paths``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from tillerman.controller.dashboard.guard import new_secret
from tillerman.ledger.paths import NotARegularFile, check_output, read_regular, replace_file

MARK = b"# tillerman dashboard secret: whoever reads this can act as you on the page\n"
LIMIT = 4096  # a secret file is one short line after the mark


def default_path() -> Path:
    """Beside the default ledger: ``$XDG_STATE_HOME/tillerman/dashboard-secret``."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "tillerman" / "dashboard-secret"


class SecretFileError(ValueError):
    """A secret file that cannot be used, with what to do."""


def load(path: Path, *, rotate: bool = False, ledgers: Iterable[str | os.PathLike] = ()) -> str:
    """The secret in ``path``, created (0600, its folder 0700 when made) when absent or
    when ``rotate``. ``ledgers``: the ledgers in use, never written over."""
    try:
        data, st = read_regular(path, limit=LIMIT)
    except FileNotFoundError:
        return _write(path, ledgers)
    except NotARegularFile as exc:
        raise SecretFileError(f"dashboard secret {path} is {exc.kind}; give a file for --secret-file") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretFileError(f"dashboard secret {path} may be read by others (mode {stat.S_IMODE(st.st_mode):o});"
                              f" run chmod 600 {path} and add --new-secret, since it may have been read")
    if not data.startswith(MARK):
        raise SecretFileError(f"{path} is not a dashboard secret tillerman wrote; it is left as it is:"
                              " give another --secret-file")
    if rotate:
        return _write(path, ledgers)
    secret = data[len(MARK):].decode("ascii", "replace").strip()
    if not secret:
        raise SecretFileError(f"dashboard secret {path} is empty; add --new-secret to write a new one")
    return secret


def _write(path: Path, ledgers: Iterable[str | os.PathLike]) -> str:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = check_output(path, "--secret-file", ledgers=ledgers, ours=lambda head: head.startswith(MARK))
    secret = new_secret()

    def write(temporary: Path) -> None:
        os.chmod(temporary, 0o600)  # whatever the file it replaces allowed
        temporary.write_bytes(MARK + secret.encode() + b"\n")

    replace_file(target, write, mode=0o600)  # a reader sees the old secret or the new one, never half
    return secret
