"""``tillerman replay`` on a terminal: a one-line progress meter on stderr while it reads,
cleared when it ends, whether the files are read in one process or by workers; never
with ``--json`` (a script's stderr stays quiet) and never in what goes to stdout. Run as
a user runs it: a whole process whose stderr is a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import msgspec
import pytest

from bench.sessions import rollout_name, write_rollout

CLEAR = "\r\033[K"


@pytest.fixture(scope="module")
def sessions(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("sessions")
    for seed in (1, 2):
        write_rollout(str(folder / rollout_name(seed)), 2_000, seed)
    return str(folder)


def _on_a_terminal(*args: str) -> tuple[bytes, str, int]:
    """(stdout, what the terminal showed, exit status) of ``tillerman replay ARGS``."""
    main, side = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "tillerman.controller", "replay", *args],
                                stdout=subprocess.PIPE, stderr=side)
    finally:
        os.close(side)
    shown = bytearray()
    try:
        while chunk := os.read(main, 65536):
            shown += chunk
    except OSError:  # EIO: every copy of the terminal's other side is closed
        pass
    finally:
        os.close(main)
    out = proc.stdout.read()
    return out, shown.decode(), proc.wait()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_replay_on_a_terminal_shows_its_progress_and_clears_it(sessions, jobs):
    out, shown, status = _on_a_terminal("--jobs", jobs, sessions)
    assert status == 0
    assert "100% " in shown  # a file read to its end
    assert all(rollout_name(seed)[-40:] in shown for seed in (1, 2))  # each file named (its tail) as it is read
    assert shown.endswith(CLEAR)  # the meter's line is left empty for the summary
    assert "100%" not in out.decode()


def test_with_json_the_terminal_shows_nothing_and_stdout_is_the_summary(sessions):
    out, shown, status = _on_a_terminal("--json", sessions)
    assert status == 0 and shown == ""
    assert msgspec.json.decode(out)["files"]
