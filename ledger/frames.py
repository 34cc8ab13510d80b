"""Messages between processes over a pipe: each one's bytes behind their length.

A replay's child processes use them: the forked reader sends parsed batches to the
replay (``tillerman.monitor.file_reader``), the replay sends prepared rows to the
process writing its ledger (``tillerman.ledger.load``). The pipe's buffer bounds what is
in flight, so memory stays flat however far ahead the sender could run.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

PIPE_BYTES = 1 << 20  # asked of the kernel for the pipe (Linux caps it at pipe-max-size)
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Linux), named here: older Pythons lack the constant
_LENGTH = struct.Struct("<Q")


def send(pipe: BinaryIO, body: bytes) -> None:
    """Write the message whole. An unbuffered pipe's ``write`` is one ``write(2)``, which
    a signal arriving while it waits for room (a stop and continue: Ctrl-Z then ``fg``,
    a debugger or profiler attaching) cuts short: what it wrote is returned, the rest
    is ours to write, or the reader reads the next message from the middle of this one."""
    data = memoryview(_LENGTH.pack(len(body)) + body)
    while data:
        written = pipe.write(data)
        data = data[written:]


def receive(pipe: BinaryIO) -> bytes | None:
    """The next message's bytes, or None at the end of the pipe (a message cut short included)."""
    head = pipe.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack(head)
    body = pipe.read(size)
    return body if len(body) == size else None


def widen(fd: int) -> None:
    """A larger pipe buffer: fewer wake-ups per batch (best effort)."""
    try:
        import fcntl

        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)
    except (ImportError, OSError):
        pass
