"""The process a load's rows are written by: ``python -m tillerman.ledger.load_writer LEDGER``
(started by ``tillerman.ledger.load.LedgerLoad``, which says why a load has one).

It is a module of its own because it writes through ``SQLiteRecorder``, whose ``load``
starts it: kept in ``tillerman.ledger.load``, the two modules would each import the other.
"""

from __future__ import annotations

import signal
import sys

from tillerman.ledger import frames
from tillerman.ledger.errors import LedgerError
from tillerman.ledger.load import Commit, decode_message
from tillerman.ledger.sqlite import SQLiteRecorder


def write(path: str) -> int:
    """Rows from stdin into the ledger at ``path``, a commit at each ``Commit`` and at the
    end of the pipe. Ignores SIGINT: Ctrl-C reaches the replay, which ends the load."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with SQLiteRecorder(path) as recorder, recorder.keys_indexed_last(), \
                open(sys.stdin.fileno(), "rb", buffering=frames.PIPE_BYTES, closefd=False) as pipe:
            ended = False
            while not ended:
                with recorder.bulk():
                    while (body := frames.receive(pipe)) is not None:
                        message = decode_message(body)
                        if isinstance(message, Commit):
                            break
                        recorder.insert_prepared(message.columns)
                    else:
                        ended = True
    except LedgerError as exc:
        print(exc, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(write(sys.argv[1]))
