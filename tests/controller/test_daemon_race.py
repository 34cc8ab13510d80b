"""A settle move the daemon would lose to another writer (a person's cancel landing
between the daemon's fold and its write) is the protocol's normal case: a round writes
in one transaction and folds what others wrote before it first, so the daemon decides
on what won and goes on deciding; its task group survives."""

from __future__ import annotations

import anyio

from tillerman.controller.core import intent_requests
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger.events import Envelope, IntentProposed, ThreadStarted
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent, text_digest
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.files import default_ruleset


class CancelledMeanwhile(SQLiteRecorder):
    """When the daemon's first decision round begins (its fold holds ``target`` as
    proposed), another process cancels the intent."""

    target: str = ""
    raced: bool = False

    def bulk(self):
        if not self.raced:
            self.raced = True
            with SQLiteRecorder(self.path) as person:
                intent_requests.cancel(person, self.target)
        return super().bulk()


def test_a_settle_move_that_loses_the_race_is_folded_not_fatal(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="seen", event=ThreadStarted(thread_id="T1"), source="appserver:x", at=1.0)])
        # mallory holds no grant: the daemon rejects the intent (proposed -> rejected, no_grant)
        mallory = intent_requests.propose(rec, thread_id="T1", mode="queue", text="later", owner="mallory")
        other = intent_requests.propose(rec, thread_id="T1", mode="queue", text="later too", owner="mallory")

    async def run():
        with CancelledMeanwhile(path) as recorder:
            recorder.target = mallory.id
            daemon = Daemon(recorder, default_ruleset(), DaemonOptions())
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                with anyio.fail_after(10):  # the round after the lost one decides again
                    while not (recorder.raced and daemon.projection.intents[other.id].state == State.REJECTED):
                        await anyio.sleep(0.02)
                assert daemon.projection.intents[mallory.id].state == State.EXPIRED  # the cancel won
                tg.cancel_scope.cancel()

    anyio.run(run)
    with SQLiteRecorder(path) as rec:
        history = intent_requests.intent_view(rec, mallory.id).history
        assert [(h.state, h.reason) for h in history if h.kind == "transition"] == [("expired", "cancelled")]


def test_the_daemon_decides_past_a_row_it_cannot_decode(tmp_path):
    path = tmp_path / "ledger.sqlite3"
    broken = Intent(id="in-broken", thread_id="T1", mode="queue", text="hi", text_digest=text_digest("hi"),
                    created_at=10.0, ack_deadline=float("inf"), expires_at=float("inf"))  # stored as null
    with SQLiteRecorder(path) as rec:
        rec.append([Envelope(event_id="seen", event=ThreadStarted(thread_id="T1"), source="appserver:x", at=1.0),
                    Envelope(event_id="broken", event=IntentProposed(thread_id="T1", intent=broken),
                             source="tillerman", at=10.0)])
        later = intent_requests.propose(rec, thread_id="T1", mode="queue", text="later", owner="mallory")

    async def run():
        with SQLiteRecorder(path) as recorder:
            daemon = Daemon(recorder, default_ruleset(), DaemonOptions())
            async with anyio.create_task_group() as tg:
                await tg.start(daemon.run)
                with anyio.fail_after(10):
                    while daemon.projection.intents[later.id].state != State.REJECTED:
                        await anyio.sleep(0.02)
                assert list(daemon.projection.undecodable) == [2]
                tg.cancel_scope.cancel()

    anyio.run(run)
