"""A decision round is one transaction: the observations it records and the decisions
they cause commit together (the loop stops for one commit, and no decision waits for
the commit of its observations); what the round drives starts only once that commit
is done, and a round that could not commit leaves no trace in the fold."""

from __future__ import annotations

import contextlib
import sqlite3

import anyio

from tests.controller.test_daemon_fold import _full_fold, _setup, seen
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger import events as ev
from tillerman.ledger import projections
from tillerman.ledger.errors import OperationalError
from tillerman.ledger.intent_states import State
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.files import default_ruleset


class Watched(SQLiteRecorder):
    """Counts transactions; makes the next ``failures`` inserts fail as a full disk would."""

    transactions: int = 0
    failures: int = 0

    @contextlib.contextmanager
    def _transaction(self, durable: bool = False):
        self.transactions += 1
        with super()._transaction(durable) as db:
            yield db

    def _insert(self, db, rows):
        if self.failures:
            self.failures -= 1
            raise sqlite3.OperationalError("disk I/O error")
        return super()._insert(db, rows)


def _daemon(recorder, started: list) -> Daemon:
    """A daemon whose rounds each drive one delivery; ``started`` gets each delivery as
    it starts."""
    daemon = Daemon(recorder, default_ruleset(), DaemonOptions(), clock=lambda: 1000.0)
    daemon.projection = projections.load(recorder)

    async def carry_out(intent_id, fact):
        started.append(intent_id)

    step = daemon.step.step

    def step_that_drives(projection, threads, now):
        daemon.round.carry("in-held", "a fact")  # as _act and the fold do for a delivery
        assert started == []  # nothing starts inside the round
        return step(projection, threads, now)

    daemon._carry_out, daemon.step.step = carry_out, step_that_drives
    return daemon


def _think(daemon: Daemon, batch) -> None:
    async def run():
        async with anyio.create_task_group() as daemon.tasks:
            daemon._due = daemon.clock()
            await daemon._think(daemon.tasks, batch)

    anyio.run(run)


def test_a_round_commits_its_observations_and_decisions_once(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    proposal = _setup(path)
    started: list[str] = []
    with Watched(path) as recorder:
        daemon = _daemon(recorder, started)
        _think(daemon, [seen("T1", 1)])
        assert recorder.transactions == 1  # the observation, the rejection and its decision
        assert daemon.projection.intents[proposal.id].state is State.REJECTED
        kinds = [type(e.envelope.event) for e in recorder.read(after_seq=2)]
        assert kinds[0] is ev.TurnStarted and ev.DecisionRecorded in kinds  # the observation first
    assert started == ["in-held"]  # after the commit
    assert daemon.projection == _full_fold(path)


def test_a_round_that_cannot_commit_starts_nothing_and_leaves_no_trace_in_the_fold(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    proposal = _setup(path)
    started: list[str] = []
    with Watched(path) as recorder:
        daemon = _daemon(recorder, started)
        before = recorder.max_seq()
        recorder.failures = 1
        try:
            _think(daemon, [seen("T1", 1)])
        except* OperationalError:
            pass
        else:
            raise AssertionError("the round's commit failed, and said nothing")
        assert started == [] and recorder.max_seq() == before
        _think(daemon, [seen("T1", 1)])  # the brain holds the batch and tries again
        assert started == ["in-held"]
        assert daemon.projection.intents[proposal.id].state is State.REJECTED
        assert sum(isinstance(e.envelope.event, ev.TurnStarted) for e in recorder.read()) == 1
    assert daemon.projection == _full_fold(path)
