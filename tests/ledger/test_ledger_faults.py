"""A ledger under faults: a full disk, a read-only file, a missing anchor, a cut tail,
forged snapshots and columns, a file truncated mid-page. Reading commands never write;
damage is exit 1 and names the last good seq; a shortened history is refused for
writing until a person accepts it."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import uuid
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from tests.faults.ledger_faults import READERS, cut_tail, fill, ledger_faults, run_cli, tiny_filesystem
from tests.ledger.recorder_contract import turn
from tillerman.controller.cli.main import main
from tillerman.controller.core import intent_requests
from tillerman.ledger import projections
from tillerman.ledger.batch import Row, row_columns
from tillerman.ledger.errors import AnchorMismatch, OperationalError
from tillerman.ledger.events import Envelope, IntentTransition
from tillerman.ledger.intent_states import State
from tillerman.ledger.recorder import content_digest, encode_payload, row_hash
from tillerman.ledger.sqlite import COLUMNS, SQLiteRecorder

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "chain-v1.sqlite3"


def cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


def propose(ledger: Path, text: str = "hi"):
    return cli("intent", "propose", "--ledger", str(ledger), "--thread", "T1", "--mode", "queue",
               "--text", text, "--owner", "ann", "--json")


def proposed_ids(ledger: Path) -> list[str]:
    result = cli("intents", "--ledger", str(ledger), "--json")
    assert result.exit_code == 0, result.output
    return sorted(item["id"] for item in msgspec.json.decode(result.output))


def head_file(ledger: Path) -> Path:
    return ledger.with_name(ledger.name + ".head")


@pytest.fixture
def ledger(tmp_path) -> Path:
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as rec:
        rec.append([turn(i) for i in range(1, 11)])
    return path


# -- 3: reading commands never write; a failed anchor write is reported and recovered ---------


def test_reading_commands_never_rewrite_the_anchor(ledger):
    with SQLiteRecorder(ledger) as rec:
        rec.append([turn(11)])
    lagging = '{"seq": 10, "hash": "%s", "schema": 2}' % dict(
        (e.seq, e.hash) for e in SQLiteRecorder(ledger, readonly=True).read())[10]
    head_file(ledger).write_text(lagging)  # as a full disk or a crash after the commit leaves it
    for command in READERS:
        result = cli(*command, "--ledger", str(ledger))
        assert result.exit_code == 0, (command, result.output)
        assert head_file(ledger).read_text() == lagging, command
    assert "lags by 1" in cli("ledger", "verify", "--ledger", str(ledger)).output


def fill_the_disk(monkeypatch) -> None:
    """ENOSPC at the anchor's temporary file (the tmpfs test below does it for real)."""
    real_fdopen = os.fdopen

    def full_disk(fd, *args, **kwargs):
        handle = real_fdopen(fd, *args, **kwargs)
        handle.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        return handle

    monkeypatch.setattr(os, "fdopen", full_disk)


def test_failed_anchor_write_is_reported_committed_and_recovered(ledger, monkeypatch):
    fill_the_disk(monkeypatch)
    result = propose(ledger)
    monkeypatch.undo()
    assert result.exit_code == 3, result.output
    intent_id = msgspec.json.decode(result.stdout)["id"]
    assert "committed, but the head anchor" in result.stderr and "No space left" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not list(ledger.parent.glob("*.tmp"))
    assert proposed_ids(ledger) == [intent_id]  # the committed row stands
    second = propose(ledger, "again")  # the next write catches the anchor up
    assert second.exit_code == 0, second.output
    report = cli("ledger", "verify", "--ledger", str(ledger))
    assert report.exit_code == 0 and "lags" not in report.output, report.output
    assert len(proposed_ids(ledger)) == 2


def test_full_disk_on_a_tiny_filesystem(monkeypatch):
    with tiny_filesystem() as where:
        if where is None:  # no CAP_SYS_ADMIN here: the injected ENOSPC test above covers the write
            pytest.skip("cannot mount a tmpfs here (no CAP_SYS_ADMIN); ENOSPC is injected instead in"
                        " test_failed_anchor_write_is_reported_committed_and_recovered")
        path = where / "l.sqlite3"
        keeper = SQLiteRecorder(path)  # keeps the -wal open: a commit then reuses its frames
        keeper.append([turn(i) for i in range(1, 200)])
        keeper._db.execute("PRAGMA wal_checkpoint(RESTART)")
        filler = fill(where)
        done = run_cli("intent", "propose", "--ledger", str(path), "--thread", "T1", "--mode", "queue",
                       "--text", "on a full disk", "--owner", "ann", "--json")
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert "No space left on device" in done.stderr
        assert not list(where.glob("*.tmp"))
        for command in READERS:  # reading works on the full disk
            read = run_cli(*command, "--ledger", str(path))
            assert "Traceback" not in read.stderr and read.returncode == 0, (command, read.stdout, read.stderr)
        filler.unlink()
        again = run_cli("intent", "propose", "--ledger", str(path), "--thread", "T1", "--mode", "queue",
                        "--text", "room again", "--owner", "ann")
        assert again.returncode == 0, again.stderr
        verify = run_cli("ledger", "verify", "--ledger", str(path))
        assert verify.returncode == 0 and "lags" not in verify.stdout, verify.stdout
        assert len(proposed_ids(path)) == 2
        keeper.close()


# -- 4: a read-only ledger can be inspected ---------------------------------------------------


def test_read_only_ledger_can_be_inspected_by_an_unprivileged_user(other_user):
    """Root ignores file modes, so the commands run as nobody on a root-owned 0644 ledger."""
    folder = Path(tempfile.mkdtemp(prefix="tillerman-ro-"))
    try:
        folder.chmod(0o755)
        path = folder / "l.sqlite3"
        with SQLiteRecorder(path) as rec:
            rec.append([turn(i) for i in range(1, 6)])
        assert propose(path).exit_code == 0
        intent_id = proposed_ids(path)[0]
        for file in folder.iterdir():
            file.chmod(0o644)
        before = {f.name: f.read_bytes() for f in folder.iterdir()}
        for command in (*READERS, ["intent", "show", intent_id]):
            done = run_cli(*command, "--ledger", str(path), user=other_user)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            assert "writable" not in done.stderr
        assert intent_id in run_cli("intents", "--ledger", str(path), user=other_user).stdout
        assert {f.name: f.read_bytes() for f in folder.iterdir()} == before  # nothing written
        refused = run_cli("intent", "propose", "--ledger", str(path), "--thread", "T1", "--mode", "queue",
                          "--text", "x", user=other_user)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_reader_sees_rows_still_in_the_wal(ledger):
    """A live writer's committed rows sit in the -wal: a read-only opener must see them."""
    writer = SQLiteRecorder(ledger)
    writer.append([turn(11)])
    assert Path(str(ledger) + "-wal").stat().st_size > 0
    with SQLiteRecorder(ledger, readonly=True) as reader:
        assert reader.max_seq() == 11 and reader.verify().ok
    writer.close()


# -- 5a/5b: a cut tail or a missing anchor stays detectable ----------------------------------


def test_cut_tail_then_appends_stays_detectable_until_accepted(ledger):
    cut_tail(ledger, 8)
    refused = propose(ledger)
    assert refused.exit_code == 1, refused.output
    assert "missing from the tail" in refused.output and "tillerman ledger accept-tail --by NAME" in refused.output
    with pytest.raises(AnchorMismatch), SQLiteRecorder(ledger) as rec:
        rec.append([turn(20)])  # the daemon's writes are refused too: an OperationalError holds dispatch
    assert issubclass(AnchorMismatch, OperationalError)
    report = cli("ledger", "verify", "--ledger", str(ledger))
    assert report.exit_code == 1 and "cut off the tail" in report.output
    accepted = cli("ledger", "accept-tail", "--ledger", str(ledger), "--by", "ann")
    assert accepted.exit_code == 0 and "accepted by ann at seq 9" in accepted.output, accepted.output
    assert propose(ledger).exit_code == 0
    report = cli("ledger", "verify", "--ledger", str(ledger))
    assert report.exit_code == 0 and "ann accepted a ledger ending at seq 8" in report.output, report.output
    again = cli("ledger", "accept-tail", "--ledger", str(ledger), "--by", "ann")
    assert again.exit_code == 2 and "nothing" not in again.output and "no shorter history" in again.output


def test_missing_anchor_of_a_ledger_that_had_one_is_reported(ledger):
    head_file(ledger).unlink()
    report = cli("ledger", "verify", "--ledger", str(ledger))
    assert report.exit_code == 1 and "anchor file is missing" in report.output, report.output
    refused = propose(ledger)
    assert refused.exit_code == 1 and "missing, but this ledger had one" in refused.output
    assert not head_file(ledger).exists()  # not silently recreated
    assert cli("ledger", "accept-tail", "--ledger", str(ledger), "--by", "ann").exit_code == 0
    assert cli("ledger", "verify", "--ledger", str(ledger)).exit_code == 0


def _anchor_moves(monkeypatch) -> list[int]:
    """The seqs the head anchor is moved to from here on, in order."""
    moves: list[int] = []
    write = SQLiteRecorder._write_anchor

    def counted(self, seq, link, **kwargs):
        moves.append(seq)
        return write(self, seq, link, **kwargs)

    monkeypatch.setattr(SQLiteRecorder, "_write_anchor", counted)
    return moves


def test_a_rounds_commits_move_the_anchor_once_when_it_ends(ledger, monkeypatch):
    moves = _anchor_moves(monkeypatch)
    with SQLiteRecorder(ledger) as rec:
        with rec.one_anchor():
            for i in range(11, 14):
                rec.append([turn(i)])
            assert msgspec.json.decode(head_file(ledger).read_bytes())["seq"] == 10  # lags, as after a crash
            assert rec.tail_problem() is None
        rec._mover.wait()  # the move is made on a thread of its own
        assert moves == [13]
        rec.append([turn(14)])  # outside a round: one move per commit, as before
    assert moves == [13, 14]
    assert msgspec.json.decode(head_file(ledger).read_bytes())["seq"] == 14


def test_a_tail_cut_while_a_round_runs_is_caught_by_the_anchor_it_writes(ledger):
    with SQLiteRecorder(ledger) as rec:
        with rec.one_anchor():
            rec.append([turn(11)])
            rec.append([turn(12)])
            cut_tail(ledger, 10)  # before the round's anchor move: the anchor still says 10
        rec._mover.wait()
        with pytest.raises(AnchorMismatch, match="missing from the tail"):
            rec.append([turn(13)])
    report = cli("ledger", "verify", "--ledger", str(ledger))
    assert report.exit_code == 1 and "cut off the tail" in report.output, report.output


def test_a_round_does_not_wait_for_its_anchor_move(ledger, monkeypatch):
    """The move (a rename the file system flushes) is made on a thread of its own."""
    release, moved = threading.Event(), []
    write = SQLiteRecorder._write_anchor

    def slow(self, seq, link, **kwargs):
        moved.append((seq, release.wait(5)))
        return write(self, seq, link, **kwargs)

    monkeypatch.setattr(SQLiteRecorder, "_write_anchor", slow)
    with SQLiteRecorder(ledger) as rec:
        with rec.one_anchor():
            rec.append([turn(11)])
        release.set()  # only now may the move finish
    assert moved == [(11, True)]
    assert msgspec.json.decode(head_file(ledger).read_bytes())["seq"] == 11


def test_a_round_that_raises_still_anchors_what_it_committed(ledger, monkeypatch):
    moves = _anchor_moves(monkeypatch)
    with SQLiteRecorder(ledger) as rec, pytest.raises(RuntimeError), rec.one_anchor():
        rec.append([turn(11)])
        raise RuntimeError("the round failed after its commit")
    assert moves == [11]  # written by the time the recorder is closed
    assert cli("ledger", "verify", "--ledger", str(ledger)).exit_code == 0


def test_the_anchor_this_connection_wrote_is_not_read_again(ledger, monkeypatch):
    import tillerman.ledger.sqlite as sqlite_module

    reads: list[bytes] = []

    class CountingJson:
        dumps = staticmethod(json.dumps)

        @staticmethod
        def loads(text):
            reads.append(text)
            return json.loads(text)

    with SQLiteRecorder(ledger) as rec:
        rec.append([turn(11)])
        monkeypatch.setattr(sqlite_module, "json", CountingJson)
        for i in range(12, 16):
            rec.append([turn(i)])
        assert reads == []  # neither the check before a commit nor the move after it
        head_file(ledger).write_text(head_file(ledger).read_text().replace(" ", "  "))  # touched, same anchor
        rec.append([turn(16)])
        assert len(reads) == 1


def test_an_anchor_changed_between_two_appends_of_one_connection_is_seen(ledger):
    with SQLiteRecorder(ledger) as rec:
        rec.append([turn(11)])
        anchor = msgspec.json.decode(head_file(ledger).read_bytes())
        head_file(ledger).write_text(json.dumps(anchor | {"seq": 12}))  # same size, same inode
        with pytest.raises(AnchorMismatch, match="missing from the tail"):
            rec.append([turn(12)])
        head_file(ledger).unlink()
        with pytest.raises(AnchorMismatch, match="missing, but this ledger had one"):
            rec.append([turn(12)])


# -- 5c: snapshots and derived columns are checked; the chain formula is versioned ----------


def _intent_ledger(ledger: Path) -> str:
    result = propose(ledger)
    assert result.exit_code == 0, result.output
    return msgspec.json.decode(result.stdout)["id"]


def test_forged_snapshot_beyond_the_chain_is_not_trusted(ledger):
    intent_id = _intent_ledger(ledger)
    forged = msgspec.msgpack.encode(projections.Projection(seq=10**9))
    db = sqlite3.connect(ledger)
    db.execute("INSERT OR REPLACE INTO snapshots (name, seq, state) VALUES (?, ?, ?)",
               (projections.SNAPSHOT_NAME, 10**9, forged))
    db.commit()
    db.close()
    assert proposed_ids(ledger) == [intent_id]
    assert intent_id in cli("overdue", "--ledger", str(ledger), "--now", "2999-01-01T00:00:00Z").output
    report = cli("ledger", "verify", "--ledger", str(ledger))
    assert report.exit_code == 1 and "beyond the chain" in report.output, report.output


def test_edited_snapshot_within_the_chain_is_reported_by_verify(ledger):
    _intent_ledger(ledger)
    with SQLiteRecorder(ledger) as rec:
        projections.save(rec, projections.load(rec))
        seq = rec.max_seq()
        edited = projections.Projection().fold(rec.read(after_seq=0, limit=seq - 1))  # the intent left out
    assert cli("ledger", "verify", "--ledger", str(ledger)).exit_code == 0
    db = sqlite3.connect(ledger)
    db.execute("UPDATE snapshots SET state = ? WHERE name = ?",
               (msgspec.msgpack.encode(msgspec.structs.replace(edited, seq=seq)), projections.SNAPSHOT_NAME))
    db.commit()
    db.close()
    report = cli("ledger", "verify", "--ledger", str(ledger))
    assert report.exit_code == 1 and "differs from a fold of the chain" in report.output, report.output


def test_a_ledger_from_the_previous_release_verifies_under_its_chain_version(tmp_path):
    path = tmp_path / FIXTURE.name
    shutil.copy(FIXTURE, path)
    shutil.copy(head_file(FIXTURE), head_file(path))
    report = cli("ledger", "verify", "--ledger", str(path), "--json")
    assert report.exit_code == 0, report.output
    data = msgspec.json.decode(report.output)
    assert data["chain_version"] == 1 and data["last_seq"] == 17
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2  # a reader never migrates
    assert propose(path).exit_code == 0  # a writer migrates the schema; the rows keep their hashes
    db = sqlite3.connect(path)
    assert db.execute("SELECT key, value FROM meta ORDER BY key").fetchall() == [
        ("anchored", "1"), ("chain_version", "1")]
    db.close()
    assert cli("ledger", "verify", "--ledger", str(path)).exit_code == 0
    head_file(path).unlink()
    assert cli("ledger", "verify", "--ledger", str(path)).exit_code == 1  # it had an anchor


def test_an_unknown_chain_version_is_refused(ledger):
    db = sqlite3.connect(ledger)
    db.execute("UPDATE meta SET value = '9' WHERE key = 'chain_version'")
    db.commit()
    db.close()
    report = cli("ledger", "verify", "--ledger", str(ledger))
    assert report.exit_code == 1 and "chain formula version 9" in report.output


# -- 5d: replaying a damaged ledger says so --------------------------------------------------


def test_replay_and_rules_diff_of_a_damaged_ledger_exit_1(ledger, tmp_path):
    cut_tail(ledger, 8)
    replay = cli("replay", "--format", "ledger", str(ledger))
    assert replay.exit_code == 1 and "damaged" in replay.output, replay.output
    rules = tmp_path / "rules.toml"
    rules.write_text("")
    diff = cli("rules", "diff", "--against", str(rules), "--ledger", str(ledger))
    assert diff.exit_code == 1 and "damaged" in diff.output, diff.output


# -- 5e: a file truncated mid-page is damage, with the last good seq ------------------------


def test_ledger_truncated_mid_page_is_damage_with_the_last_good_seq(tmp_path):
    path = tmp_path / "l.sqlite3"
    with SQLiteRecorder(path) as rec:
        for start in range(0, 600, 100):
            rec.append([turn(i, thread=f"t-{uuid.UUID(int=i)}") for i in range(start + 1, start + 101)])
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - 4096 - 1000)  # into the middle of a page near the end
    report = cli("ledger", "verify", "--ledger", str(path))
    assert report.exit_code == 1, report.output
    assert "DAMAGED" in report.output and "last good seq" in report.output
    last_good = int(report.output.split("last good seq ")[1].split()[0])
    assert 0 < last_good < 600
    for command in (["intents"], ["ledger", "export"], ["status"]):
        result = cli(*command, "--ledger", str(path))
        assert result.exit_code in (0, 1) and "not a readable" not in result.output, (command, result.output)


# -- the torture run's ledger stage ----------------------------------------------------------


def test_torture_ledger_stage_passes(other_user):
    passed, table = ledger_faults(other_user)
    assert passed, table


def test_a_rule_proposal_whose_anchor_write_fails_is_reported_committed(ledger, monkeypatch, tmp_path):
    """`rules propose` commits like `intent propose`, and says so the same way (exit 3)."""
    from tests.controller.test_rules_cli import PROPOSAL

    proposal = tmp_path / "proposal.toml"
    proposal.write_text(PROPOSAL)
    proposal.chmod(0o600)
    fill_the_disk(monkeypatch)
    result = cli("rules", "propose", str(proposal), "--ledger", str(ledger), "--by", "ann")
    monkeypatch.undo()
    assert result.exit_code == 3, result.output
    assert "proposed quiet-steer v1" in result.stdout and "committed, but the head anchor" in result.stderr


# -- a state this version does not know ------------------------------------------------------


def test_a_stored_unknown_intent_state_is_reported_and_skipped(ledger):
    """A transition to a state this version does not know (a newer writer's, or forged
    with a valid chain): every reader reports the row and skips it, the intent stays
    where its last known move left it, and the ledger refuses to move it further."""
    intent_id = _intent_ledger(ledger)
    with SQLiteRecorder(ledger) as rec:
        head = list(rec.read())[-1]
        env = Envelope(event_id="future", source="tillerman", at=50.0, observed_at=50.0,
                       event=IntentTransition(thread_id="T1", intent_id=intent_id, from_state="proposed",
                                              to_state="teleported", reason="newer"))
        payload = encode_payload(env)
        digest = content_digest(env, payload)
        row = Row(head.seq + 1, env, payload, digest, head.hash, row_hash(head.hash, head.seq + 1, env, payload, digest))
        rec._db.execute(f"INSERT INTO events ({COLUMNS}) VALUES ({', '.join('?' * 15)})", row_columns(row))
        rec._write_anchor(row.seq, row.hash)
        assert rec.verify().ok
        with pytest.raises(intent_requests.LostRace, match="'teleported' is not an intent state"):
            intent_requests.cancel(rec, intent_id)
    projection = projections.load(SQLiteRecorder(ledger, readonly=True))
    assert projection.intents[intent_id].state is State.PROPOSED
    assert projection.undecodable == {row.seq: "intent_transition: unknown intent state 'teleported'"}
    for args in (["intents", "--json"], ["status", "--json"], ["intent", "show", intent_id, "--json"]):
        result = cli(*args, "--ledger", str(ledger))
        assert result.exit_code == 0, (args, result.output)
    shown = msgspec.json.decode(cli("intent", "show", intent_id, "--json", "--ledger", str(ledger)).stdout)
    assert shown["state"] == "proposed"
    assert f"warning: ledger seq {row.seq} cannot be decoded" in cli("intents", "--ledger", str(ledger)).stderr
