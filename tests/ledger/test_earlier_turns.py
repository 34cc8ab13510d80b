"""A long session's turn table: recent turns by id, older ones by digest, every turn
still known with its state, at a few bytes per ended turn."""

import gc
import tracemalloc

from tillerman.ledger import events as ev
from tillerman.ledger import projections
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.projections import RECENT_TURNS, Projection

BYTES_PER_ENDED_TURN = 16  # the allowance for a compact id set, per entry


def turn_id(i: int) -> str:
    return f"019a{i:028x}"  # as long as a Codex turn id


def turn_events(first: int, count: int):
    """Turns ``first``… of thread t: most complete, every 7th is interrupted, every 5th
    is left unclosed by the next one's start."""
    for i in range(first, first + count):
        yield ev.TurnStarted(thread_id="t", turn_id=turn_id(i))
        if i % 5:
            yield ev.TurnCompleted(thread_id="t", turn_id=turn_id(i), status="interrupted" if i % 7 == 0 else "completed")


def expected_state(i: int, last: int) -> str:
    if i % 5 == 0:
        return "active" if i == last else "unclosed"
    return "interrupted" if i % 7 == 0 else "completed"


def fold_into(projection: Projection, events, seq: int = 0) -> int:
    for event in events:
        seq += 1
        projection.apply(Entry(seq=seq, envelope=Envelope(event_id=f"e{seq}", event=event, source="file:x", at=float(seq)),
                               prev_hash="", hash=""))
    return seq


def test_every_turn_of_a_long_session_keeps_its_state_and_late_copies_are_one_turn():
    turns = 2_001  # the last one (a multiple of 5) is still active
    projection = Projection()
    seq = fold_into(projection, turn_events(0, turns))
    snap = projection.snapshot("t")
    assert len(snap.turn_states) <= RECENT_TURNS
    assert all(snap.turn_state(turn_id(i)) == expected_state(i, turns - 1) for i in range(turns))
    assert snap.turn_state("never-seen") is None and snap.turn_state(None) is None
    # A lagging copy of an early turn's start and end changes nothing: it ended long ago.
    fold_into(projection, [ev.TurnStarted(thread_id="t", turn_id=turn_id(3)),
                           ev.TurnCompleted(thread_id="t", turn_id=turn_id(10), status="failed")], seq)
    after = projection.snapshot("t")
    assert after.active_turn_id == turn_id(turns - 1)
    assert after.turn_state(turn_id(3)) == "completed" and after.turn_state(turn_id(10)) == "unclosed"


def test_the_saved_projection_keeps_the_earlier_turns():
    projection = Projection()
    fold_into(projection, turn_events(0, 500))
    recorder = MemoryRecorder()
    recorder.append([Envelope(event_id="x", event=ev.TurnStarted(thread_id="u", turn_id="z"), source="file:x")])
    projection.seq = 0  # the snapshot covers nothing of this recorder's rows: it folds them after
    projections.save(recorder, projection)
    loaded = projections.load(recorder)
    assert loaded.threads["t"] == projection.threads["t"]
    assert loaded.snapshot("t").turn_state(turn_id(1)) == "completed"


def test_ended_turns_cost_at_most_16_bytes_each():
    projection = Projection()
    seq = fold_into(projection, turn_events(0, 2_000))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fold_into(projection, turn_events(2_000, 20_000), seq)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown / 20_000 <= BYTES_PER_ENDED_TURN, f"{grown / 20_000:.1f} bytes per ended turn"
