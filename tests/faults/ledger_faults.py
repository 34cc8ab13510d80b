"""Ledger faults, with real processes: a full file system (a small tmpfs), a read-only
ledger (read by an unprivileged user), a deleted head anchor, a tail cut and then
appended to. ``ledger_faults`` is the torture run's ledger stage; the helpers serve the
tests in ``tests/ledger/test_ledger_faults.py`` too.

Every command runs as ``python -m tillerman.controller``; the stage fails on any traceback and on
any committed row (an intent whose propose exited 0, or 3: committed, anchor not moved)
missing afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.installs import OtherUser, build_wheel, install_for_other_user, why_no_other_user

ROOT = Path(__file__).resolve().parents[2]
#: Every reading command, with the arguments it needs after ``--ledger PATH``.
READERS = (["ledger", "verify"], ["intents"], ["status"], ["ledger", "export"], ["overdue"])


def run_cli(*args: str, user: OtherUser | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``tillerman ARGS`` in a new process; as another ``user`` when given (root ignores
    file modes, so only an unprivileged user sees a read-only ledger), with that user's
    installed tillerman, from a folder they can enter. ``env``: more environment
    variables (a fault hook)."""
    command = ("-m", "tillerman.controller", *args)
    argv, cwd = (user.command(*command), "/") if user else ([sys.executable, *command], ROOT)
    env = dict(os.environ, HOME="/tmp", PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@contextlib.contextmanager
def tiny_filesystem(size: str = "2m") -> Iterator[Path | None]:
    """A small tmpfs mount (root with CAP_SYS_ADMIN may); None where mounting is not allowed."""
    where = Path(tempfile.mkdtemp(prefix="tillerman-tinyfs-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True).returncode == 0
    try:
        yield where if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def fill(directory: Path) -> Path:
    """Fill the file system under ``directory``; the filler file is returned for removal."""
    filler = directory / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as fh:
        while True:
            fh.write(b"\0" * 4096)
            fh.flush()
    return filler


def cut_tail(path: Path, after: int) -> None:
    db = sqlite3.connect(path)
    db.execute("DELETE FROM events WHERE seq > ?", (after,))
    db.commit()
    db.close()


class Stage:
    def __init__(self, other_user: OtherUser) -> None:
        self.other_user = other_user
        self.failures: list[str] = []
        self.committed: dict[Path, list[str]] = {}
        self.commands = 0

    def run(self, *args: str, user: OtherUser | None = None, expect: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        done = run_cli(*args, user=user)
        self.commands += 1
        if "Traceback" in done.stderr:
            self.failures.append(f"{' '.join(args[:2])}: traceback: {done.stderr.strip().splitlines()[-1]}")
        elif done.returncode not in expect:
            self.failures.append(f"{' '.join(args[:2])}: exit {done.returncode}, expected {expect}:"
                                 f" {(done.stderr or done.stdout).strip()[:200]}")
        return done

    def propose(self, ledger: Path, text: str, expect: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        done = self.run("intent", "propose", "--ledger", str(ledger), "--thread", "T1", "--mode", "queue",
                        "--text", text, "--owner", "ann", "--json", expect=expect)
        if done.returncode in (0, 3):
            self.committed.setdefault(ledger, []).append(json.loads(done.stdout)["id"])
        return done

    def readers(self, ledger: Path, user: OtherUser | None = None, expect: tuple[int, ...] = (0,)) -> None:
        for command in READERS:
            self.run(*command, "--ledger", str(ledger), user=user, expect=expect)

    def nothing_lost(self, ledger: Path, label: str) -> None:
        done = self.run("intents", "--ledger", str(ledger), "--json")
        listed = {item["id"] for item in json.loads(done.stdout or "[]")}
        if missing := [i for i in self.committed.get(ledger, []) if i not in listed]:
            self.failures.append(f"{label}: committed intents lost: {missing}")
        self.run("ledger", "verify", "--ledger", str(ledger))


@contextlib.contextmanager
def _scratch_folder(prefix: str) -> Iterator[Path]:
    """A new folder under the system temp directory, removed with everything in it afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _seeded(folder: Path, stage: Stage) -> Path:
    path = folder / "ledger.sqlite3"
    for number in range(3):
        stage.propose(path, f"seed {number}")
    return path


def disk_full(stage: Stage) -> str:
    with tiny_filesystem() as where:
        if where is None:
            stage.failures.append("disk full: cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
            return "disk full: not run"
        path = _seeded(where, stage)
        from tillerman.ledger.events import Envelope, TurnStarted
        from tillerman.ledger.sqlite import SQLiteRecorder

        keeper = SQLiteRecorder(path)  # holds a grown -wal open, so a commit reuses its frames
        keeper.append([Envelope(event_id=f"fill{i}", event=TurnStarted(thread_id="t", turn_id=f"u{i}"), source="torture")
                       for i in range(200)])
        keeper._db.execute("PRAGMA wal_checkpoint(RESTART)")
        filler = fill(where)
        full = stage.propose(path, "on a full disk", expect=(2, 3))  # refused whole, or committed sans anchor
        stage.readers(path)
        if list(where.glob("*.tmp")):
            stage.failures.append("disk full: a temporary anchor file was left behind")
        filler.unlink()
        stage.propose(path, "room again")
        stage.nothing_lost(path, "disk full")
        keeper.close()
        return f"disk full: propose exit {full.returncode}, readers ok, recovered"


def read_only(stage: Stage) -> str:
    with _scratch_folder("tillerman-ro-") as folder:
        folder.chmod(0o755)
        path = _seeded(folder, stage)
        for file in folder.iterdir():
            file.chmod(0o644)
        stage.readers(path, user=stage.other_user)
        stage.run("intent", "propose", "--ledger", str(path), "--thread", "T1", "--mode", "queue", "--text", "x",
                  user=stage.other_user, expect=(2,))
        stage.nothing_lost(path, "read-only")
        return "read-only: readers ok as nobody, propose refused with exit 2"


def anchor_missing(stage: Stage) -> str:
    with _scratch_folder("tillerman-anchor-") as folder:
        path = _seeded(folder, stage)
        Path(f"{path}.head").unlink()
        stage.run("ledger", "verify", "--ledger", str(path), expect=(1,))
        stage.propose(path, "refused", expect=(1,))
        stage.run("ledger", "accept-tail", "--ledger", str(path), "--by", "torture")
        stage.propose(path, "after acceptance")
        stage.nothing_lost(path, "anchor missing")
        return "anchor missing: reported, writes refused until accept-tail"


def tail_cut(stage: Stage) -> str:
    with _scratch_folder("tillerman-tail-") as folder:
        path = _seeded(folder, stage)
        cut_tail(path, 1)
        stage.committed[path] = stage.committed[path][:1]  # cut on purpose: not a loss by tillerman
        stage.propose(path, "on a cut tail", expect=(1,))
        stage.propose(path, "again on a cut tail", expect=(1,))
        stage.run("ledger", "verify", "--ledger", str(path), expect=(1,))
        stage.run("ledger", "accept-tail", "--ledger", str(path), "--by", "torture")
        stage.propose(path, "after acceptance")
        stage.nothing_lost(path, "tail cut")
        return "tail cut then appended: appends refused, reported until accept-tail"


def ledger_faults(other_user: OtherUser) -> tuple[bool, str]:
    """The torture run's ledger stage: (passed, summary table). ``other_user`` reads the
    read-only ledger."""
    stage = Stage(other_user)
    lines = [scenario(stage) for scenario in (disk_full, read_only, anchor_missing, tail_cut)]
    table = "\n".join(["ledger faults — %d commands" % stage.commands, *("  " + line for line in lines),
                       *("  FAIL " + f for f in stage.failures)])
    return not stage.failures, table


def ledger_faults_on_their_own() -> tuple[bool, str]:
    """``ledger_faults`` outside pytest (the torture run): this tree's wheel installed for
    the other user in a scratch folder first."""
    if (reason := why_no_other_user()) is not None:
        return False, f"ledger faults — not run: {reason}"
    with _scratch_folder("tillerman-other-user-") as folder:
        (folder / "source").mkdir()
        (folder / "dist").mkdir()
        wheel = build_wheel(folder / "source", folder / "dist")
        return ledger_faults(install_for_other_user(folder, wheel))
