"""A reader that goes away (`tillerman ledger export | head -1`) ends the command quietly,
as it ends cat: no ``Error: [Errno 32] Broken pipe`` line, no traceback."""

import fcntl
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_reader_that_stops_reading_ends_the_command_without_an_error_line(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    session = ROOT / "fixtures" / "sessions" / "codex-rollout"
    subprocess.run([sys.executable, "-m", "tillerman.controller", "replay", "--ledger", str(ledger), str(session)],
                   check=True, capture_output=True)
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # far less than the export: it must wait on the reader
    export = subprocess.Popen([sys.executable, "-m", "tillerman.controller", "ledger", "export", "--ledger", str(ledger)],
                              stdout=write_end, stderr=subprocess.PIPE)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.readline()  # one row read, then the reader goes away
    stderr = export.stderr.read().decode()
    assert export.wait(timeout=60) != 0  # the rows were not all written: not a success
    assert stderr == "", stderr
