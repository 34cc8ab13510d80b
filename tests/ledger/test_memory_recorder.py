import msgspec

from tests.ledger.recorder_contract import RecorderContract, turn
from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger.batch import row_columns
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.config import load_effective


class TestMemoryRecorder(RecorderContract):
    def make_recorder(self, tmp_path):
        return MemoryRecorder()


def test_rows_and_hashes_match_sqlite():
    """The same appends give the same chain as the SQLite backend."""
    batches = [[turn(1), turn(2)], [turn(2), turn(3)], [turn(4, thread="t2")]]
    mem, lite = MemoryRecorder(), SQLiteRecorder(":memory:")
    for batch in batches:
        batch = [msgspec.structs.replace(e, observed_at=1.0) for e in batch]
        assert mem.append(batch) == lite.append(batch)
    assert list(mem.read()) == list(lite.read())
    assert [row_columns(r) for r in mem._rows] == list(lite.rows())


def test_replay_records_the_same_entries(tmp_path):
    """Replay into either backend: the same summary, the same entries."""
    ruleset = load_effective(None, None).ruleset
    mem, lite = MemoryRecorder(), SQLiteRecorder(":memory:")
    a = Replayer(mem, ruleset).run(["fixtures/sessions"])
    b = Replayer(lite, ruleset).run(["fixtures/sessions"])
    assert a == b

    def strip(entry):  # tillerman's own records are observed at wall-clock time
        env = entry.envelope
        return (entry.seq, env.event_id, env.event, env.at, env.source, env.offset, env.length,
                env.observed_at if env.source != "tillerman" else None)

    assert [strip(e) for e in mem.read()] == [strip(e) for e in lite.read()]
    assert mem.verify().ok
