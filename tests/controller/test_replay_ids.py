"""Replay in memory keeps an event id only where a later input could offer it again:
not for a session file read once, but for a file named twice and for every file
when a ledger (which repeats the ids of the files it followed) is among the inputs."""

from collections import Counter

import pytest

from tillerman.controller.replay import replayer as replay
from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger.chain_only import ChainOnlyRecorder
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.file_reader import ForkedFileReader
from tillerman.rules.config import load_effective

STUCK = "fixtures/disagreement/stuck/rollout-2026-10-21T14-00-00-0199b000-0000-7000-8000-00000000dd01.jsonl"
INPUTS = ["fixtures/sessions/codex-rollout", "fixtures/disagreement"]


def rows_by_source(recorder: MemoryRecorder) -> Counter:
    return Counter(entry.envelope.source.split(":")[0] for entry in recorder.read())


def test_session_files_read_once_leave_only_replays_own_ids():
    ruleset = load_effective(None, None).ruleset
    keeping = MemoryRecorder()
    expected = Replayer(keeping, ruleset).run(INPUTS)
    recorder = ChainOnlyRecorder()
    assert Replayer(recorder, ruleset).run(INPUTS) == expected
    rows = rows_by_source(keeping)
    assert rows["file"] > 0 and rows["tillerman"] > 0
    assert recorder.ids_kept() == rows["tillerman"]  # its intents and decisions, not the files' observations
    assert recorder.head[0] == keeping.max_seq()  # the same rows, numbered alike (the files' not chained)


def test_a_file_named_twice_keeps_its_ids_and_its_copy_is_dropped():
    ruleset = load_effective(None, None).ruleset
    recorder = ChainOnlyRecorder()
    summary = Replayer(recorder, ruleset).run([STUCK, STUCK])
    assert summary == Replayer(MemoryRecorder(), ruleset).run([STUCK, STUCK])
    assert recorder.ids_kept() > summary.files[0].events  # the first copy's, and replay's own


def test_with_a_ledger_among_the_inputs_its_copies_of_the_files_events_are_dropped(tmp_path):
    ruleset = load_effective(None, None).ruleset
    ledger = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(ledger) as into:
        Replayer(into, ruleset).run([STUCK])
    paths = [STUCK, str(ledger)]
    recorder = ChainOnlyRecorder()
    summary = Replayer(recorder, ruleset).run(paths)
    keeping = MemoryRecorder()
    assert summary == Replayer(keeping, ruleset).run(paths)
    assert recorder.head[0] == keeping.max_seq()
    assert rows_by_source(keeping)["file"] == Replayer(MemoryRecorder(), ruleset).run([STUCK]).events


@pytest.mark.parametrize(("into", "ids_in_child"), [("memory", False), ("load", True), ("named twice", True)])
def test_a_forked_reader_makes_the_ids_on_the_side_with_time_for_them(into, ids_in_child, monkeypatch, tmp_path):
    """In memory, a file read once is numbered, not chained: the replay's process has time
    for the ids, the parsing child has none. Where the replay chains the rows (a load into
    a new ledger, a file named twice), the child makes them."""
    made = []

    class Recording(ForkedFileReader):
        def __init__(self, *args, ids_in_child: bool) -> None:
            made.append(ids_in_child)
            super().__init__(*args, ids_in_child=ids_in_child)

    monkeypatch.setattr(replay, "ForkedFileReader", Recording)
    monkeypatch.setattr(replay, "PARSE_AHEAD_BYTES", 0)
    monkeypatch.setattr(replay, "LOAD_BYTES", 0)
    monkeypatch.setattr(replay, "_may_fork", lambda: True)
    ruleset = load_effective(None, None).ruleset
    paths = [STUCK, STUCK] if into == "named twice" else [STUCK]
    expected = Replayer(MemoryRecorder(), ruleset).run(paths)
    if into == "load":
        with SQLiteRecorder(tmp_path / "ledger.sqlite3") as ledger:
            summary = Replayer(ledger, ruleset, parse_ahead=True).run(paths)
    else:
        summary = Replayer(ChainOnlyRecorder(), ruleset, parse_ahead=True).run(paths)
    assert summary == expected
    assert made and set(made) == {ids_in_child}
