"""A file read in a forked child (``ForkedFileReader``) gives what reading it here gives,
event for event and count for count; its faults come back as this process's errors,
and no child outlives its reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tillerman.monitor.file_reader import FileReader, ForkedFileReader, ReaderDied
from tillerman.monitor.formats import PARSERS
from tillerman.monitor.identity import file_identity, read_first_line

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS = ROOT / "fixtures" / "sessions" / "codex-rollout"
_BEFORE: set[int] = set()
HOSTILE = (
    b'{"timestamp":"2026-11-30T00:00:00.000Z","type":"session_meta","payload":{"id":"t-1"}}\n'
    b'{"timestamp":"2026-11-30T00:00:01.000Z","type":"event_msg","payload":{"type":"task_started","turn_id":"u1"}}\n'
    b'not json at all\n'
    b'{"type":"event_msg","payload":{"type":"agent_message","message":"\xff\xfe"}}\n'
    b'{"type":"event_msg","payload":{"type":"agent_message","message":"a\x00b"}}\n'
    b'{"timestamp":"2026-11-30T00:00:02.000Z","type":"brand_new_type","payload":{}}\n'
    b'[1, 2, 3]\n'
    b'{"timestamp":"2026-11-30T00:00:03.000Z","type":"event_msg","payload":{"type":"task_complete","turn_id":"u1"}}\n'
    b'{"timestamp":"2026-11-30T00:00:04.000Z","type":"event_msg","payload":{"type":"task_st'
)


def read(reader_type: type[FileReader], path: Path, chunk: int = 1 << 20, fmt: str = "codex-rollout", **options):
    parser = PARSERS[fmt](source=f"file:{path}")
    reader = reader_type(str(path), parser, file_identity(path, read_first_line(path)), chunk, **options)
    chunks = list(reader.chunks())
    return chunks, reader.account


@pytest.mark.parametrize("ids_in_child", [True, False])
@pytest.mark.parametrize("chunk", [7, 4096, 1 << 20])
@pytest.mark.parametrize("name", sorted(p.name for p in ROLLOUTS.glob("*.jsonl")) + ["hostile"])
def test_a_file_read_in_a_child_reads_as_it_does_here(name, chunk, ids_in_child, tmp_path):
    """Whichever side makes the ids."""
    path = ROLLOUTS / name
    if name == "hostile":
        path = tmp_path / "rollout-hostile.jsonl"
        path.write_bytes(HOSTILE)
    here, here_account = read(FileReader, path, chunk)
    there, there_account = read(ForkedFileReader, path, chunk, ids_in_child=ids_in_child)
    assert there == here
    assert there_account == here_account
    assert here_account is not None and here_account.records > 0


def test_the_hostile_file_is_quarantined_and_counted_not_lost(tmp_path):
    path = tmp_path / "rollout-hostile.jsonl"
    path.write_bytes(HOSTILE)
    chunks, account = read(ForkedFileReader, path)
    reasons = sorted(fe.event.reason for _, events in chunks for fe in events if hasattr(fe.event, "reason"))
    assert reasons == ["invalid_json", "invalid_utf8", "not_an_object", "nul_bytes", "truncated"]
    assert account.counts.quarantined == 5 and account.unknown_types == {"brand_new_type": 1}
    assert account.threads == ["t-1"] and chunks[-1][0] == len(HOSTILE)


def test_a_read_error_in_the_child_is_this_processs_oserror(tmp_path):
    folder = tmp_path / "not-a-file.jsonl"
    folder.mkdir()
    parser = PARSERS["codex-rollout"](source="file:x")
    reader = ForkedFileReader(str(folder), parser, "0:0:00", 1 << 20)
    with pytest.raises(IsADirectoryError):
        list(reader.chunks())
    assert_no_child_left()


class _Broken(PARSERS["codex-rollout"]):
    def feed(self, data: bytes):
        raise RuntimeError("a fault of the parser's")


def test_a_child_that_dies_is_a_clear_error_naming_how_and_what_to_do(tmp_path, capfd):
    path = ROLLOUTS / sorted(p.name for p in ROLLOUTS.glob("rollout-*.jsonl"))[0]
    reader = ForkedFileReader(str(path), _Broken(source="file:x"), "0:0:00", 1 << 20)
    with pytest.raises(ReaderDied, match=r"ended before the end of the file \(exit status 1\).*--jobs 1"):
        list(reader.chunks())
    assert "a fault of the parser's" in capfd.readouterr().err  # the child's traceback is shown
    assert_no_child_left()


def test_a_reader_stopped_early_leaves_no_child(tmp_path):
    path = tmp_path / "rollout-long.jsonl"
    from bench.sessions import write_rollout

    write_rollout(str(path), 3000, seed=7)
    parser = PARSERS["codex-rollout"](source="file:x")
    chunks = ForkedFileReader(str(path), parser, "0:0:00", 4096).chunks()
    next(chunks)
    chunks.close()
    assert_no_child_left()


@pytest.fixture(autouse=True)
def _children_before():
    global _BEFORE
    _BEFORE = children()


def children() -> set[int]:
    """This process's children, zombies included (Linux's ``/proc``)."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


def assert_no_child_left() -> None:
    assert children() <= _BEFORE, "a child of the reader was left behind"


def test_event_ids_are_the_ones_earlier_versions_gave():
    """A ledger holds ids made this way: another formula would store every event of a
    file read again a second time."""
    from tillerman.monitor.identity import event_ids, file_event_id

    identity = "2049:1234:0123456789abcdef"
    assert file_event_id(identity, 98765, 2) == "f-20ff0c5fe9ac3848f1a9fdebbcd7b9d6"
    assert event_ids(identity)(98765, 2) == file_event_id(identity, 98765, 2)
