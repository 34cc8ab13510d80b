"""The daemon folds what it appends: a round reads the ledger back only for rows another
writer added, and its fold is the one a fresh read of the whole ledger gives."""

from __future__ import annotations

import anyio

from tillerman.controller.core import intent_requests
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger import projections
from tillerman.ledger.events import Envelope, ThreadStarted, TurnStarted
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.files import default_ruleset


class CountingReads(SQLiteRecorder):
    reads: int = 0

    def read(self, after_seq: int = 0, limit: int | None = None):
        self.reads += 1
        return super().read(after_seq, limit)


def seen(thread_id: str, n: int) -> Envelope:
    return Envelope(event_id=f"turn-{thread_id}-{n}", event=TurnStarted(thread_id=thread_id, turn_id=f"u{n}"),
                    source="appserver:x", at=100.0 + n)


def _setup(path):
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="seen", event=ThreadStarted(thread_id="T1"), source="appserver:x", at=1.0)])
        # mallory holds no grant: the round rejects it (a transition and a decision written)
        return intent_requests.propose(rec, thread_id="T1", mode="queue", text="later", owner="mallory")


def _round(recorder, batch, *, before=None) -> Daemon:
    daemon = Daemon(recorder, default_ruleset(), DaemonOptions(), clock=lambda: 1000.0)
    daemon.projection = projections.load(recorder)
    if before is not None:
        before()
    recorder.reads = 0

    async def run():
        async with anyio.create_task_group() as tg:
            daemon._due = daemon.clock()  # every thread and open intent is decided this round
            await daemon._think(tg, batch)

    anyio.run(run)
    return daemon


def _full_fold(path) -> projections.Projection:
    with SQLiteRecorder(path, readonly=True) as reader:
        return projections.Projection().fold(reader.read())


def test_a_round_with_no_other_writer_reads_nothing_back(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    proposal = _setup(path)
    with CountingReads(path) as recorder:
        daemon = _round(recorder, [seen("T1", 1)])
        assert recorder.reads == 0  # appended three times (observation, transition, decision), read never
        assert daemon.projection.intents[proposal.id].state is State.REJECTED
        assert daemon.projection.seq == recorder.max_seq()
    assert daemon.projection == _full_fold(path)


def test_rows_another_writer_added_are_read_before_ours(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    _setup(path)

    def person_proposes():
        with SQLiteRecorder(path) as person:
            person_proposes.intent = intent_requests.propose(person, thread_id="T2", mode="queue", text="hi", owner="eve")

    with CountingReads(path) as recorder:
        daemon = _round(recorder, [seen("T2", 2)], before=person_proposes)
        assert recorder.reads == 1  # the gap before the round's first append, once
        assert daemon.projection.intents[person_proposes.intent.id].state is State.REJECTED  # judged this round
        assert daemon.projection.seq == recorder.max_seq()
    assert daemon.projection == _full_fold(path)
