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

**A ledger's own folder.** ``ledger archive`` writes in the segment folder, which the
rule above keeps everyone else out of: there ``check_own_file`` lets a name be written
only when nothing is there or a regular file (never a symlink) tillerman left there.

**A ledger a person names** (``--ledger``, ``$TILLERMAN_LEDGER``, ``ledger copy``'s
paths) goes through ``check_ledger_path`` before it is opened: a FIFO, a device or a
folder is refused, and so is a companion of a SQLite file beside it (``L.head``,
``L-wal``, ``L.head.lock``, a file in ``L.segments/`` …), which opened as a ledger
would be made into a second one beside the first. An archive segment may be read
(``verify`` checks one alone).

**Reading without blocking.** ``read_regular`` reads a regular file of bounded size and
nothing else: a FIFO or a device at its name is refused on an open that cannot block.

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


def check_own_file(path: str | os.PathLike, what: str, *, ours: Callable[[bytes], bool]) -> Path:
    """``path``, in a folder tillerman keeps for a ledger (its archive segments), when a
    file may be put there: nothing is there, or a regular file, not a symlink, whose
    first bytes ``ours`` recognises as one tillerman left (a run stopped before its
    end). Anything else was put there by someone else and is refused (``UnsafeOutput``):
    a symlink (to the ledger or anywhere), a FIFO, a device, a directory."""
    name = os.fspath(path)
    try:
        st = os.lstat(name)
    except FileNotFoundError:
        return Path(name)
    except OSError as exc:
        raise UnsafeOutput(f"cannot write {what} {name}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeOutput(f"cannot write {what} {name}: it is a symlink (to {os.readlink(name)}), where tillerman"
                           " keeps only its own files; move it away")
    if (kind := file_kind(st)) is not None:
        raise UnsafeOutput(f"cannot write {what} {name}: it is {kind}, where tillerman keeps only its own files;"
                           " move it away")
    try:
        head, _ = read_regular(name, limit=HEAD_BYTES, follow=False)
    except (OSError, NotARegularFile) as exc:
        raise UnsafeOutput(f"cannot write {what} {name}: {_why(exc)}") from None
    if not ours(head):
        raise UnsafeOutput(f"cannot write {what} {name}: the file there is not one tillerman wrote; move it away")
    return Path(name)


def check_ledger_path(path: str | os.PathLike, *, readonly: bool = False) -> LedgerFiles:
    """The ledger a person named, by its real path, or ``UnsafeOutput`` when it must not
    be opened as one (see the module docstring); ``readonly``: the command only reads,
    so an archive segment may be opened."""
    files = ledger_files(path)
    given, real = os.fspath(path), files.path
    try:
        st = os.stat(real)
    except OSError:  # nothing there, or nothing that can be looked at: opening it says why
        st = None
    if st is not None and (kind := file_kind(st)) is not None:  # SQLite would block on a FIFO, or fail late
        raise UnsafeOutput(f"the ledger {_shown(given, real)} is not a regular file but {kind}; give the path of the"
                           " ledger file")
    if readonly and st is not None and _in_segment_folder(real):
        return files
    if (role := _role(real, ())) is not None:
        raise UnsafeOutput(f"{_shown(given, real)} is {role}, not a ledger; give the ledger's own path")
    return files


class NotARegularFile(ValueError):
    """What is at a path is not a regular file; ``kind`` says what it is."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"it is {kind}")
        self.kind = kind


def read_regular(path: str | os.PathLike, *, limit: int, follow: bool = True) -> tuple[bytes, os.stat_result]:
    """At most ``limit`` bytes of the regular file at ``path``, with its ``fstat``.
    Opened without blocking and checked on the open descriptor, so a FIFO or a device
    (or a symlink to one) is refused at once (``NotARegularFile``), never waited on;
    ``follow=False``: a symlink at ``path`` is refused too (``OSError`` ELOOP). Raises
    ``OSError`` when it cannot be opened (``FileNotFoundError``: nothing there)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if (kind := file_kind(st)) is not None:
            raise NotARegularFile(kind)
        chunks, size = [], 0
        while size < limit and (chunk := os.read(fd, min(limit - size, 1 << 16))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks), st
    finally:
        os.close(fd)


def file_kind(st: os.stat_result) -> str | None:
    """What ``st`` describes when it is not a regular file ("a FIFO (named pipe)" …)."""
    if stat.S_ISREG(st.st_mode):
        return None
    return NOT_A_FILE.get(stat.S_IFMT(st.st_mode), "not a regular file")


def _in_segment_folder(real: str) -> bool:
    folder = os.path.dirname(real)
    return folder.endswith(".segments") and _is_sqlite(folder[: -len(".segments")])


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
    if (kind := file_kind(st)) is not None:
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
    if _in_segment_folder(real):
        return f"in the archive segment folder of the ledger {os.path.dirname(real)[: -len('.segments')]}"
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
        return read_regular(real, limit=HEAD_BYTES, follow=False)[0]
    except (OSError, NotARegularFile) as exc:
        raise UnsafeOutput(f"cannot write {what} {_shown(given, real)}: {_why(exc)}") from None


def _why(exc: OSError | NotARegularFile) -> str:
    if isinstance(exc, NotARegularFile):
        return f"it is {exc.kind}; give the path of a regular file"
    if exc.errno == errno.ENXIO:  # a FIFO nobody reads, or a socket
        return "it is not a regular file (a FIFO or a socket); give the path of a regular file"
    if isinstance(exc, IsADirectoryError):
        return "it is a directory; give the path of a regular file"
    return f"{exc.strerror or exc}"


def _shown(given: str, real: str) -> str:
    """The path as the person gave it, and where it leads when that is elsewhere."""
    return given if os.path.abspath(given) == real else f"{given} (which leads to {real})"
