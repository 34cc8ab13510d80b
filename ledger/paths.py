"""A SQLite ledger's files, and where tillerman may write a file at all.

**The ledger's identity.** A ledger is known by its real path: a symlink to it, or a path
through a symlinked folder, is the same ledger, so its lock, head anchor, SQLite's log
files and its archive segments are named from the real path (``ledger_files``), once. A
second name must never mean a second lock or a second anchor.

**The safe output rule.** Every command that writes a file a person named (``report
--db``, ``timeline --html``, ``run --trace``, ``ledger copy``'s target, ``hooks
install``'s settings, ``rules promote --rules``) or that tillerman names itself in a
folder a person gave (the Claude Code hook spool and outboxes) goes through
``check_output`` (a file replaced) or ``open_for_append`` (a file appended to). They
refuse, in one line (``UnsafeOutput``), and before anything is written:

* a directory, a FIFO (opening one for writing blocks until someone reads), a device, a
  socket — and a symlink to any of those;
* a tillerman ledger or any file that belongs to one (its lock, head anchor, ``-wal``,
  ``-shm``, ``-journal``, archive segments), by name and by device and inode, and a
  symlink to any of those; and any other SQLite database unless the caller recognises it
  as its own (a report database);
* a path whose folder does not exist.

A symlink to a file that may be written is written through: the file it leads to is
replaced (``replace_file``: written beside it under a new name, then renamed over it,
so a reader never sees half a file), and the link stays.

Standard library only: the Claude Code hook imports it at every event.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tillerman.ledger.errors import UnsafeOutput

SQLITE_MAGIC = b"SQLite format 3\x00"
#: How much of an existing file a caller's ``ours`` sees to recognise a file it wrote.
HEAD_BYTES = 4096
#: What a path may lead to besides a regular file, by ``stat.S_IFMT``.
NOT_A_FILE = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}
#: A ledger's companion files by the suffix added to its path, with what each is.
COMPANIONS = {".lock": "daemon lock", ".head": "head anchor", ".head.lock": "head anchor's lock",
              "-wal": "SQLite write-ahead log", "-shm": "SQLite shared-memory index",
              "-journal": "SQLite rollback journal", ".segments": "archive segment folder"}
_HEAD_TEMPORARY = re.compile(r"\.head\.[0-9]+\.tmp\Z")  # an anchor being written (LedgerFiles.head_temporary)


@dataclass(frozen=True)
class LedgerFiles:
    """The files of the SQLite ledger at ``path`` (its real path)."""

    path: str

    @property
    def lock(self) -> str:
        return self.path + ".lock"

    @property
    def head(self) -> str:
        return self.path + ".head"

    @property
    def head_lock(self) -> str:
        return self.path + ".head.lock"

    @property
    def wal(self) -> str:
        return self.path + "-wal"

    @property
    def segments(self) -> str:
        return self.path + ".segments"

    def head_temporary(self, pid: int) -> str:
        return f"{self.head}.{pid}.tmp"

    def role_of(self, real: str) -> str | None:
        """What ``real`` (a real path) is to this ledger: the ledger, one of its companion
        files, a file in its segment folder; None when it is none of them."""
        if real == self.path:
            return "the ledger"
        if real.startswith(self.path):
            suffix = real[len(self.path):]
            if suffix in COMPANIONS:
                return f"the {COMPANIONS[suffix]} of the ledger {self.path}"
            if _HEAD_TEMPORARY.fullmatch(suffix):
                return f"the head anchor of the ledger {self.path}, being written"
            if suffix.startswith(".segments/"):
                return f"in the archive segment folder of the ledger {self.path}"
        return None


def ledger_files(path: str | os.PathLike) -> LedgerFiles:
    """The ledger at ``path`` by its real path (see the module docstring)."""
    return LedgerFiles(os.path.realpath(os.path.abspath(path)))


def check_output(path: str | os.PathLike, what: str, *, ledgers: Iterable[str | os.PathLike] = (),
                 ours: Callable[[bytes], bool] | None = None, force: bool = False) -> Path:
    """The real path ``what`` (e.g. ``"--html"``) may be written to by replacing the file
    there, or ``UnsafeOutput`` (see the module docstring). ``ledgers``: the ledgers the
    command uses, protected even when nothing else shows what they are.

    An existing regular file is replaced only when it is not a SQLite database and, with
    ``ours`` given, when ``ours`` recognises its first bytes as a file of this kind that
    tillerman wrote (``force``: any file that is not a SQLite database); a SQLite database
    only when ``ours`` recognises it."""
    given, real = _resolved(path, what)
    if (role := _role(real, ledgers)) is not None:  # by name: a companion not there now still is one
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: it is {role}; give another path")
    try:
        st = os.lstat(real)  # real: no symlink left to follow
    except FileNotFoundError:
        return Path(real)
    except OSError as exc:
        raise UnsafeOutput(f"cannot write {what} {given}: {exc.strerror}") from None
    _refuse_special(given, real, what, st, ledgers)
    head = _first_bytes(given, real, what)
    if ours is not None and ours(head):
        return Path(real)
    if head.startswith(SQLITE_MAGIC):
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: it is a SQLite database tillerman did not write"
                           " there (a ledger?); give another path")
    if ours is not None and not force:
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: the file exists and is not one tillerman wrote;"
                           " give a new path, or --force to replace it")
    return Path(real)


def open_for_append(path: str | os.PathLike, what: str, *, ledgers: Iterable[str | os.PathLike] = (),
                    mode: int = 0o600) -> int:
    """A descriptor open for appending to ``path`` (created with ``mode``), after the same
    refusals as ``check_output``; an existing file that is not a SQLite database is
    appended to. Checked on the open descriptor too, so a FIFO put there meanwhile is
    refused, not waited on."""
    given, real = _resolved(path, what)
    if (role := _role(real, ledgers)) is not None:
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: it is {role}; give another path")
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(real, flags, mode)
    except OSError as exc:
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: {_why(exc)}") from None
    try:
        _refuse_special(given, real, what, os.fstat(fd), ledgers)
        if os.pread(fd, len(SQLITE_MAGIC), 0) == SQLITE_MAGIC:
            raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: it is a SQLite database (a ledger?);"
                               " give another path")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_file(target: Path, write: Callable[[Path], None], *, mode: int = 0o666) -> None:
    """Put a new ``target`` (a path ``check_output`` returned) in place atomically:
    ``write`` fills a new file beside it, which is then renamed over it. An existing
    file's permission bits are kept; a new one gets ``mode`` less the umask. A failure
    leaves the target as it was and no file beside it."""
    try:
        keep = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        keep = None
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode))
        if keep is not None:
            os.chmod(temporary, keep)
        write(temporary)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _resolved(path: str | os.PathLike, what: str) -> tuple[str, str]:
    """The path as given and its real path, whose folder must exist."""
    given = os.fspath(path)
    if not given.strip():
        raise UnsafeOutput(f"{what} is empty; give the path of a file")
    real = os.path.realpath(os.path.abspath(given))
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: the folder {folder} does not exist")
    return given, real


def _refuse_special(given: str, real: str, what: str, st: os.stat_result,
                    ledgers: Iterable[str | os.PathLike]) -> None:
    """Refuses what is not a regular file, and a ledger or a file of one."""
    kind = NOT_A_FILE.get(stat.S_IFMT(st.st_mode))
    if kind is None and not stat.S_ISREG(st.st_mode):
        kind = "not a regular file"
    if kind is not None:
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: it is {kind}; give the path of a regular file")
    if (role := _role(real, ledgers, st)) is not None:
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: it is {role}; give another path")


def _role(real: str, ledgers: Iterable[str | os.PathLike], st: os.stat_result | None = None) -> str | None:
    """What ``real`` is to a ledger: one of ``ledgers`` (by name, or as the same file by
    device and inode) or a file of one, or a companion of the SQLite file whose name it
    extends (any ledger, named or not)."""
    for files in map(ledger_files, ledgers):
        if (role := files.role_of(real)) is not None:
            return role
        if st is not None and any(_same_file(st, name) for name in (files.path, files.head, files.lock,
                                                                      files.head_lock, files.wal)):
            return f"a file of the ledger {files.path} (the same file under another name)"
    for suffix, name in COMPANIONS.items():
        if real.endswith(suffix) and _is_sqlite(real[: -len(suffix)]):
            return f"the {name} of the SQLite database {real[: -len(suffix)]}"
    match = _HEAD_TEMPORARY.search(real)
    if match and _is_sqlite(real[: match.start()]):
        return f"the head anchor of the ledger {real[: match.start()]}, being written"
    folder = os.path.dirname(real)
    if folder.endswith(".segments") and _is_sqlite(folder[: -len(".segments")]):
        return f"in the archive segment folder of the ledger {folder[: -len('.segments')]}"
    return None


def _same_file(st: os.stat_result, name: str) -> bool:
    try:
        other = os.stat(name)
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


def _is_sqlite(name: str) -> bool:
    """Whether ``name`` is a regular file that starts as a SQLite database does (an empty
    file is one too: SQLite makes a new database of it, as a ledger's first open does)."""
    try:
        st = os.stat(name)
        if not stat.S_ISREG(st.st_mode):
            return False
        if st.st_size == 0:
            return True
        with open(name, "rb") as file:
            return file.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def _first_bytes(given: str, real: str, what: str) -> bytes:
    """The first ``HEAD_BYTES`` of a regular file (opened without blocking, in case it
    was swapped for a FIFO since it was looked at)."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: {_why(exc)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: it is not a regular file;"
                               " give the path of a regular file")
        return os.pread(fd, HEAD_BYTES, 0)
    finally:
        os.close(fd)


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENXIO:  # a FIFO nobody reads, or a socket
        return "it is not a regular file (a FIFO or a socket); give the path of a regular file"
    if isinstance(exc, IsADirectoryError):
        return "it is a directory; give the path of a regular file"
    return f"{exc.strerror or exc}"


def _shown(given: str, real: str) -> str:
    """The path as the person gave it, and where it leads when that is elsewhere."""
    return given if os.path.abspath(given) == real else f"{given} (which leads to {real})"
