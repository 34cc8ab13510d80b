"""Reading a rule or config file safely: a regular file, of bounded size, that only
this user or root could have written (a rule's ``verify`` and the config's commands
run as this user)."""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Callable
from pathlib import Path

from tillerman.ledger.paths import NotARegularFile, read_regular
from tillerman.rules.errors import RuleSetError

#: The most a rule or config file may hold. Real ones are a few KiB; the limit keeps a
#: path that leads somewhere huge from filling memory while it is read.
MAX_FILE_BYTES = 1 << 20


def read_file(path: Path, *, on_unsafe: Callable[[str], None] | None = None) -> str:
    """The text of a rule or config file.

    Only a regular file of at most ``MAX_FILE_BYTES`` is read: the path is opened
    without blocking (a FIFO with no writer would wait forever) and checked on the
    open descriptor, so a symlink to ``/dev/zero`` or a FIFO is refused at once.

    A rule's ``verify`` and the config's commands run as this user, so a file that
    someone else could have written is as good as their command (``unsafe_problem``):
    with ``on_unsafe`` None it is refused, as ``tillerman run`` and its reloads do;
    otherwise ``on_unsafe`` gets the same one-line message and the file is read anyway.
    """
    try:
        data, st = read_regular(path, limit=MAX_FILE_BYTES + 1)
    except NotARegularFile as exc:
        raise RuleSetError(f"{path}: {exc.kind}, not a regular file; give the path of a rule or config file") from None
    except OSError as exc:
        raise RuleSetError(f"{path}: cannot read it ({exc.strerror}); check the path given") from None
    problem = unsafe_problem(path, st)
    if problem is not None:
        if on_unsafe is None:
            raise RuleSetError(problem)
        on_unsafe(problem)
    if len(data) > MAX_FILE_BYTES:
        raise RuleSetError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, the most a rule or config file may hold;"
                           " check the path given")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise RuleSetError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8") from None


def unsafe_problem(path: Path, st: os.stat_result) -> str | None:
    """Why someone other than this user or root could have written the file ``st``
    describes, or None. As ssh does for its config: the file must be owned by the
    effective user or root and writable by no group or other. The directories holding
    it (as named, and after symlinks) are held to the same, since whoever can write a
    directory can replace the file in it; a sticky directory such as /tmp is fine, as
    only a file's owner may replace it there. Directories further up are not checked.
    """
    problem = _foreign_writer(st, path, sticky_ok=False)
    if problem is not None:
        return f"{path}: {problem}"
    named = Path(os.path.abspath(path)).parent
    for directory in dict.fromkeys((named, Path(os.path.realpath(path)).parent)):
        try:
            problem = _foreign_writer(os.stat(directory), directory, sticky_ok=True)
        except OSError:
            continue  # not ours to look at (no search permission): the file alone is judged
        if problem is not None:
            return f"{path}: its directory {directory} is {problem}"
    return None


_CONSEQUENCE = "tillerman run refuses it, since its commands would run as you"


def _foreign_writer(st: os.stat_result, path: Path, *, sticky_ok: bool) -> str | None:
    """What lets another user write ``path`` (described by ``st``), and the fix."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return f"owned by {_user(st.st_uid)}, not by you ({_user(me)}) or root: {_CONSEQUENCE}; fix: chown {_user(me)} {path}"
    writers = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writers and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return (f"writable by {' and '.join(writers)} (mode {stat.S_IMODE(st.st_mode):04o}): {_CONSEQUENCE};"
                f" fix: chmod go-w {path}")
    return None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
