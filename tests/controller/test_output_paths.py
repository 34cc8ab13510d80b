"""Every command that writes a file writes it only where it is safe
(tillerman.ledger.paths): pointed at the ledger, one of its companion files, a symlink to
either, a FIFO, a device, a directory or a folder that does not exist, each one refuses
in one line, exits 2 (the Claude Code hook: 0, with one stderr line) and changes nothing;
none of them blocks on a FIFO."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.controller.test_rules_cli import PROPOSAL
from tests.ledger.test_archive import BEFORE, history_ledger
from tillerman.controller.claude import hook_claim
from tillerman.controller.claude.hook_outbox import MAX_OUTBOX, Outbox, Parcel, write_outbox
from tillerman.controller.cli.main import main
from tillerman.controller.cli.report import is_timeline_page
from tillerman.controller.report.db import is_report_db
from tillerman.ledger.errors import UnsafeOutput
from tillerman.ledger.paths import check_output, ledger_files, open_for_append, replace_file

#: A hostile output path, by name: what it is, made inside the test's folder.
HOSTILE = ("ledger", "anchor", "lock", "wal", "link-to-ledger", "link-to-anchor", "fifo", "device", "directory",
           "missing-folder")


@contextlib.contextmanager
def no_hang(seconds: int = 20):
    """Fails the test instead of waiting forever (a FIFO opened for writing blocks)."""
    def expire(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def place(tmp_path):
    """A ledger with its anchor, a daemon's lock file and a WAL, and the hostile paths."""
    ledger = history_ledger(tmp_path / "l.sqlite3")
    files = ledger_files(ledger)
    Path(files.lock).write_text("12345")
    Path(files.wal).write_bytes(b"")
    (tmp_path / "link-to-ledger").symlink_to(ledger)
    (tmp_path / "link-to-anchor").symlink_to(files.head)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "directory").mkdir()
    paths = {"ledger": ledger, "anchor": Path(files.head), "lock": Path(files.lock), "wal": Path(files.wal),
             "link-to-ledger": tmp_path / "link-to-ledger", "link-to-anchor": tmp_path / "link-to-anchor",
             "fifo": tmp_path / "fifo", "device": Path("/dev/null"), "directory": tmp_path / "directory",
             "missing-folder": tmp_path / "nowhere" / "out"}
    return tmp_path, ledger, paths


def snapshot(root: Path) -> dict[str, tuple]:
    """Every name under ``root`` with its type and, for a file, its content's digest."""
    seen = {}
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else None
        seen[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), digest,
                                              os.readlink(path) if path.is_symlink() else None)
    return seen


def _settings_link(root: Path, target: Path) -> list[str]:
    """``hooks install`` writes DIR/.claude/settings.json: here a symlink to ``target``."""
    project = root / "project"
    (project / ".claude").mkdir(parents=True, exist_ok=True)
    link = project / ".claude" / "settings.json"
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    return ["hooks", "install", "--claude", "--project", str(project), "--spool", str(root / "directory")]


def _proposed(root: Path, ledger: Path) -> str:
    """A rule proposed in the ledger, for ``rules promote`` to install; its id."""
    proposal = root / "proposal.toml"
    proposal.write_text(PROPOSAL)
    result = CliRunner().invoke(main, ["rules", "propose", str(proposal), "--ledger", str(ledger)])
    assert result.exit_code == 0, result.output
    return "quiet-steer"


def assert_one_error_line(result) -> None:
    """Exit 2 and one ``Error:`` line (click adds its usage lines before a usage error's)."""
    assert result.exit_code == 2, result.output
    assert [line for line in result.output.splitlines() if line.startswith("Error")] == [
        result.output.splitlines()[-1]], result.output
    assert result.output.startswith(("Error: ", "Usage: ")) and "Traceback" not in result.output, result.output


#: Each command that writes a file, given the ledger and where to write.
COMMANDS: dict[str, Callable[[Path, Path, Path], list[str]]] = {
    "report --db": lambda root, ledger, out: ["report", "--ledger", str(ledger), "--db", str(out)],
    "timeline --html": lambda root, ledger, out: ["timeline", "--ledger", str(ledger), "--html", str(out)],
    "run --trace": lambda root, ledger, out: ["run", "--no-codex", "--watch", str(root / "directory"), "--ledger",
                                              str(ledger), "--trace", str(out)],
    "ledger copy": lambda root, ledger, out: ["ledger", "copy", str(ledger), str(out)],
    "hooks install": lambda root, ledger, out: _settings_link(root, out),
    "rules promote --rules": lambda root, ledger, out: [
        "rules", "promote", _proposed(root, ledger), "--to", "shadow", "--by", "ann", "--evaluation", "e",
        "--rollback-trigger", "r", "--rules", str(out), "--ledger", str(ledger)],
}


@pytest.mark.parametrize("target", HOSTILE)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_file_writing_command_refuses_a_hostile_path_in_one_line_and_changes_nothing(
        place, command, target, monkeypatch):
    root, ledger, paths = place
    monkeypatch.setattr("tillerman.controller.daemon.daemon.run_daemon", lambda *args: None)  # never started
    args = COMMANDS[command](root, ledger, paths[target])
    before = snapshot(root)
    with no_hang():
        result = CliRunner().invoke(main, args)
    assert_one_error_line(result)
    assert snapshot(root) == before
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("target", HOSTILE)
def test_the_claude_code_hook_keeps_no_payload_where_its_spool_file_may_not_be_written(place, target):
    """The hook's spool file is ``<spool>/<session_id>.jsonl``: here a symlink to each
    hostile path (a FIFO would block Claude Code, which waits for the hook)."""
    root, _ledger, paths = place
    spool = root / "spool"
    spool.mkdir()
    (spool / "s1.jsonl").symlink_to(paths[target])
    before = snapshot(root)
    payload = json.dumps({"session_id": "s1", "hook_event_name": "PostToolUse"})
    done = subprocess.run([sys.executable, "-m", "tillerman.controller.claude_hook", "--spool", str(spool)],
                          input=payload.encode(), capture_output=True, timeout=20)
    assert done.returncode == 0 and done.stdout == b""
    assert done.stderr.count(b"\n") == 1 and b"payload not kept" in done.stderr, done.stderr
    assert snapshot(root) == before


@pytest.mark.parametrize("target", HOSTILE)
def test_an_outbox_that_may_not_be_written_is_not(place, target, caplog):
    root, ledger, paths = place
    spool = root / "spool"
    spool.mkdir()
    (spool / "s1.outbox.json").symlink_to(paths[target])
    before = snapshot(root)
    with no_hang():
        write_outbox(spool / "s1.outbox.json", Outbox(str(ledger), (Parcel("i1", "Stop", "hello"),)))
    assert snapshot(root) == before
    assert "cannot write the outbox" in caplog.text


# -- the rule itself --------------------------------------------------------------------------


def test_a_symlink_to_a_file_that_may_be_written_is_written_through(tmp_path):
    target = tmp_path / "dotfiles" / "page.html"
    target.parent.mkdir()
    target.write_text("<!doctype html>\n<title>tillerman timeline: 0 threads</title>")
    link = tmp_path / "page.html"
    link.symlink_to(target)
    real = check_output(link, "--html", ours=is_timeline_page)
    replace_file(real, lambda new: new.write_text("new page"))
    assert link.is_symlink() and target.read_text() == "new page"
    assert sorted(p.name for p in target.parent.iterdir()) == ["page.html"]  # nothing left beside it


def test_an_ordinary_file_is_replaced_only_with_force_and_a_foreign_database_never(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    with pytest.raises(UnsafeOutput, match="not one tillerman wrote; give a new path, or --force"):
        check_output(notes, "--db", ours=is_report_db)
    assert check_output(notes, "--db", ours=is_report_db, force=True) == notes
    foreign = tmp_path / "other.db"
    foreign.write_bytes(b"SQLite format 3\x00" + bytes(200))
    with pytest.raises(UnsafeOutput, match="SQLite database tillerman did not write"):
        check_output(foreign, "--db", ours=is_report_db, force=True)


def test_a_companion_is_known_without_being_told_which_ledger_and_a_hard_link_by_inode(place):
    root, ledger, paths = place
    for name in ("anchor", "lock", "wal"):
        with pytest.raises(UnsafeOutput, match="of the SQLite database"):
            check_output(paths[name], "--html")
    hard = root / "hard-link-to-anchor"
    os.link(paths["anchor"], hard)
    with pytest.raises(UnsafeOutput, match="the same file under another name"):
        check_output(hard, "--html", ledgers=[ledger])


def test_a_failed_write_leaves_the_old_file_and_nothing_beside_it(tmp_path):
    old = tmp_path / "account.db"
    old.write_text("old")

    def fail(new: Path) -> None:
        new.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_file(old, fail)
    assert old.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["account.db"]


def test_append_refuses_a_fifo_without_blocking_and_a_sqlite_file(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with no_hang(), pytest.raises(UnsafeOutput, match="FIFO"):
        open_for_append(tmp_path / "fifo", "the trace file")
    db = tmp_path / "x.db"
    db.write_bytes(b"SQLite format 3\x00" + bytes(100))
    with pytest.raises(UnsafeOutput, match="SQLite database"):
        open_for_append(db, "the trace file")


def test_report_db_replaces_its_own_database_and_timeline_its_own_page(place):
    root, ledger, _paths = place
    for args in (["report", "--db", str(root / "account.db")], ["timeline", "--html", str(root / "t.html")]):
        for _ in range(2):  # the second run recognises the first's file and replaces it
            result = CliRunner().invoke(main, [args[0], "--ledger", str(ledger), *args[1:]])
            assert result.exit_code == 0, result.output
    assert is_report_db((root / "account.db").read_bytes()[:100])
    assert is_timeline_page((root / "t.html").read_bytes()[:4096])
    notes = root / "notes.txt"
    notes.write_text("my notes")
    refused = CliRunner().invoke(main, ["report", "--ledger", str(ledger), "--db", str(notes)])
    assert refused.exit_code == 2 and notes.read_text() == "my notes"
    forced = CliRunner().invoke(main, ["report", "--ledger", str(ledger), "--db", str(notes), "--force"])
    assert forced.exit_code == 0 and is_report_db(notes.read_bytes()[:100])


def test_a_companion_name_is_refused_while_no_such_file_is_there(place):
    """A ledger's ``-wal`` comes and goes; written as a file, SQLite would take it for the log."""
    root, ledger, paths = place
    paths["wal"].unlink()
    for name in ("-wal", "-shm", "-journal", ".head.lock"):
        with pytest.raises(UnsafeOutput, match="of the SQLite database|of the ledger"):
            check_output(f"{ledger}{name}", "--html")
    result = CliRunner().invoke(main, ["ledger", "copy", str(ledger), f"{ledger}-wal"])
    assert_one_error_line(result)
    assert not Path(f"{ledger}-wal").exists()


# -- ledger archive writes only its own files in the segment folder ---------------------------

#: What may be put where ``ledger archive`` writes, by name: made at ``at``.
PLANTED: dict[str, Callable[[Path, Path], None]] = {
    "fifo": lambda at, ledger: os.mkfifo(at),
    "link-to-ledger": lambda at, ledger: at.symlink_to(ledger),
    "link-to-a-file": lambda at, ledger: at.symlink_to(ledger.parent / "notes.txt"),
    "link-to-device": lambda at, ledger: at.symlink_to("/dev/null"),
    "directory": lambda at, ledger: at.mkdir(),
    "a-foreign-file": lambda at, ledger: at.write_text("my notes"),
}
#: Where, in the ledger's segment folder (a directory there is the folder itself).
ARCHIVE_NAMES = [(where, what) for where in ("segment", "temporary", "temporary-journal", "folder")
                 for what in PLANTED if (where, what) != ("folder", "directory")]


def _segment_name(tmp_path: Path, ledger: Path) -> str:
    """The name the archive gives this ledger's segment, learnt from a copy (the same rows
    make the same name)."""
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in (ledger, Path(ledger_files(ledger).head)):
        (copy / name.name).write_bytes(name.read_bytes())
    result = CliRunner().invoke(main, ["ledger", "archive", "--before", BEFORE, "--ledger", str(copy / ledger.name)])
    assert result.exit_code == 0, result.output
    (segment,) = Path(ledger_files(copy / ledger.name).segments).glob("seq-*.sqlite3")
    return segment.name


@pytest.mark.parametrize(("where", "what"), ARCHIVE_NAMES)
def test_archive_refuses_what_was_put_where_it_writes_and_moves_nothing(tmp_path, where, what):
    root = tmp_path / "real"
    root.mkdir()
    ledger = history_ledger(root / "l.sqlite3")
    (root / "notes.txt").write_text("my notes")
    Path(ledger_files(ledger).lock).write_text(str(os.getpid()))  # what the archive's own lock writes
    folder = Path(ledger_files(ledger).segments)
    at = {"segment": folder / _segment_name(tmp_path, ledger), "temporary": folder / "archive.tmp",
          "temporary-journal": folder / "archive.tmp-journal", "folder": folder}[where]
    if where != "folder":
        folder.mkdir()
    PLANTED[what](at, ledger)
    before = snapshot(root)
    with no_hang():
        result = CliRunner().invoke(main, ["ledger", "archive", "--before", BEFORE, "--ledger", str(ledger)])
    assert_one_error_line(result)
    assert "cannot write the archive segment" in result.output and "move it away" in result.output, result.output
    assert snapshot(root) == before  # the ledger, its anchor, what was there: all as they were, nothing left beside
    assert CliRunner().invoke(main, ["ledger", "verify", "--ledger", str(ledger)]).output.startswith("ok: 10 rows")


def test_archive_replaces_an_unfinished_segment_and_its_leftovers(tmp_path):
    """An archive stopped before its commit left its segment (and a temporary file): the
    next run puts the same rows under the same name."""
    ledger = history_ledger(tmp_path / "l.sqlite3")
    folder = Path(ledger_files(ledger).segments)
    (tmp_path / "elsewhere").mkdir()
    unfinished = folder / _segment_name(tmp_path / "elsewhere", ledger)
    folder.mkdir()
    unfinished.write_bytes(b"SQLite format 3\x00" + bytes(100))
    (folder / "archive.tmp").write_bytes(b"")
    (folder / "archive.tmp-journal").write_bytes(b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7" + bytes(20))
    result = CliRunner().invoke(main, ["ledger", "archive", "--before", BEFORE, "--ledger", str(ledger)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in folder.iterdir()) == [unfinished.name]
    assert CliRunner().invoke(main, ["ledger", "verify", "--ledger", str(ledger)]).exit_code == 0


# -- a ledger a person names is a ledger, not one of its files ------------------------------------

#: Each command that opens (or creates) the ledger a person names, given that path.
OPENERS: dict[str, Callable[[Path, Path, str], list[str]]] = {
    "intent propose": lambda root, ledger, given: ["intent", "propose", "--ledger", given, "--thread", "T1",
                                                   "--mode", "queue", "--text", "hi"],
    "$TILLERMAN_LEDGER": lambda root, ledger, given: ["intent", "propose", "--thread", "T1", "--mode", "queue",
                                                      "--text", "hi"],
    "run": lambda root, ledger, given: ["run", "--no-codex", "--watch", str(root / "directory"), "--ledger", given],
    "status": lambda root, ledger, given: ["status", "--ledger", given],
    "ledger verify": lambda root, ledger, given: ["ledger", "verify", "--ledger", given],
    "ledger archive": lambda root, ledger, given: ["ledger", "archive", "--before", BEFORE, "--ledger", given],
    "ledger copy SOURCE": lambda root, ledger, given: ["ledger", "copy", given, str(root / "new-copy.sqlite3")],
    "ledger copy TARGET": lambda root, ledger, given: ["ledger", "copy", str(ledger), given],
    "rules propose": lambda root, ledger, given: ["rules", "propose", str(root / "proposal.toml"), "--ledger", given],
}
#: What is given as the ledger: a companion of the ledger (there or not), or not a file.
NOT_A_LEDGER: dict[str, Callable[[Path, dict], Path]] = {
    "anchor": lambda ledger, paths: paths["anchor"],
    "anchor's lock": lambda ledger, paths: Path(f"{ledger}.head.lock"),
    "wal": lambda ledger, paths: paths["wal"],
    "journal": lambda ledger, paths: Path(f"{ledger}-journal"),
    "lock": lambda ledger, paths: paths["lock"],
    "in the segment folder": lambda ledger, paths: Path(f"{ledger}.segments") / "new.sqlite3",
    "link-to-anchor": lambda ledger, paths: paths["link-to-anchor"],
    "fifo": lambda ledger, paths: paths["fifo"],
    "device": lambda ledger, paths: paths["device"],
    "directory": lambda ledger, paths: paths["directory"],
}


@pytest.mark.parametrize("given", sorted(NOT_A_LEDGER))
@pytest.mark.parametrize("command", sorted(OPENERS))
def test_a_ledger_companion_fifo_device_or_folder_given_as_the_ledger_is_refused(place, command, given, monkeypatch):
    root, ledger, paths = place
    (root / "proposal.toml").write_text(PROPOSAL)
    monkeypatch.setattr("tillerman.controller.daemon.daemon.run_daemon", lambda *args: None)  # never started
    path = str(NOT_A_LEDGER[given](ledger, paths))
    if command == "$TILLERMAN_LEDGER":
        monkeypatch.setenv("TILLERMAN_LEDGER", path)
    before = snapshot(root)
    with no_hang():
        result = CliRunner().invoke(main, OPENERS[command](root, ledger, path))
    assert_one_error_line(result)
    assert snapshot(root) == before


def test_an_archive_segment_may_still_be_read_alone(tmp_path):
    ledger = history_ledger(tmp_path / "l.sqlite3")
    assert CliRunner().invoke(main, ["ledger", "archive", "--before", BEFORE, "--ledger", str(ledger)]).exit_code == 0
    (segment,) = Path(ledger_files(ledger).segments).glob("seq-*.sqlite3")
    verified = CliRunner().invoke(main, ["ledger", "verify", "--ledger", str(segment)])
    assert verified.exit_code == 0 and verified.output.startswith("ok:"), verified.output
    written = CliRunner().invoke(main, ["intent", "propose", "--ledger", str(segment), "--thread", "T1", "--mode",
                                        "queue", "--text", "hi"])
    assert_one_error_line(written)
    assert "in the archive segment folder" in written.output


# -- the Claude Code hook never waits on what is at the outbox's name ------------------------------

#: What may be at ``<spool>/<session>.outbox.json`` besides an outbox, made at ``at``.
NOT_AN_OUTBOX: dict[str, Callable[[Path, dict], None]] = {
    "fifo": lambda at, paths: os.mkfifo(at),
    "link-to-fifo": lambda at, paths: at.symlink_to(paths["fifo"]),
    "link-to-device": lambda at, paths: at.symlink_to("/dev/null"),
    "directory": lambda at, paths: at.mkdir(),
    "too-large": lambda at, paths: at.write_bytes(b" " * (MAX_OUTBOX + 1)),
}


@pytest.mark.parametrize("what", sorted(NOT_AN_OUTBOX))
@pytest.mark.parametrize("event", ["Stop", "PreToolUse"])
def test_the_claude_code_hook_treats_what_is_not_an_outbox_as_none_in_one_line(place, what, event):
    """Claude Code waits on the hook: a FIFO read there would hold the agent for ever."""
    root, _ledger, paths = place
    spool = root / "spool"
    spool.mkdir()
    NOT_AN_OUTBOX[what](spool / "s1.outbox.json", paths)
    payload = json.dumps({"session_id": "s1", "hook_event_name": event})
    done = subprocess.run([sys.executable, "-m", "tillerman.controller.claude_hook", "--spool", str(spool)],
                          input=payload.encode(), capture_output=True, timeout=20)
    assert done.returncode == 0 and done.stdout == b""
    assert done.stderr.count(b"\n") == 1 and b"outbox" in done.stderr, done.stderr
    assert json.loads((spool / "s1.jsonl").read_text()) == json.loads(payload)  # the payload is kept


@pytest.mark.parametrize("name", ["missing-ledger", "anchor", "lock", "wal", "link-to-anchor", "fifo", "device",
                                  "directory"])
def test_the_hooks_claim_opens_only_an_existing_ledger_that_the_outbox_names(place, name) -> None:
    """The outbox names the ledger the hook claims in; the hook never creates a ledger there,
    never opens a companion file, a FIFO or a device as one, and never blocks."""
    root, _ledger, paths = place
    target = root / "missing-ledger" if name == "missing-ledger" else paths[name]
    before = snapshot(root)
    with no_hang():
        claim = hook_claim.claim(str(target), "in-0", event="Stop", turn_id="p-1")
    assert not claim.claimed and claim.why.startswith("ledger_error"), claim
    assert snapshot(root) == before
