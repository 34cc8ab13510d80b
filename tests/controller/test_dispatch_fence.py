"""The fence on dispatch, through the driver, on a real PostgreSQL ledger: the durable
dispatch record is appended only under a current lease, and the lease is checked again
just before the send. A daemon whose lease lapsed sends nothing."""

from __future__ import annotations

import time

import pytest

from tests.controller.test_adapter import FakeAppServer, adapter_for, grants, make_intent
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Dispatch
from tillerman.controller.core.intent_requests import intent_view, proposal_envelopes
from tillerman.controller.dispatch.driver import carry_out
from tillerman.controller.dispatch.leases_keeper import Fence, LeaseKeeper
from tillerman.ledger.errors import Fenced
from tillerman.ledger.events import Envelope, TurnStarted
from tillerman.ledger.postgres import PostgresRecorder
from tillerman.ledger.projections import Projection

pytestmark = pytest.mark.anyio
NOW = 1_000.0
SHORT = 0.3  # seconds: a lease that lapses within the test


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def ledger(postgres_dsn):
    with PostgresRecorder(postgres_dsn) as rec:
        yield rec


def proposed(recorder, intent) -> None:
    recorder.append([Envelope(event_id="turn", event=TurnStarted(thread_id=intent.thread_id, turn_id="turn-1"),
                              source="appserver", at=NOW)])
    recorder.append(proposal_envelopes(intent, Projection()))


def lapse(lease) -> None:
    time.sleep(max(0.0, lease.expires_at - time.time()) + 0.05)


async def test_a_current_lease_dispatches_once(ledger):
    intent = make_intent()
    proposed(ledger, intent)
    fence = Fence(ledger.leases().acquire(intent.thread_id, "daemon-a", 30), ledger.leases())
    server = FakeAppServer(turn__steer={"turnId": "turn-1"})
    await carry_out(Delivery(intent), Dispatch(NOW, "a1"), ledger, adapter_for(ledger, server, grants("steer")),
                    fence=fence)
    assert server.methods() == ["turn/steer"]
    assert intent_view(ledger, intent.id).state == "queued"


async def test_a_lapsed_lease_writes_no_dispatch_record_and_sends_nothing(ledger):
    intent = make_intent()
    proposed(ledger, intent)
    stale = ledger.leases().acquire(intent.thread_id, "daemon-a", SHORT)
    lapse(stale)
    server = FakeAppServer(turn__steer={"turnId": "turn-1"})
    with pytest.raises(Fenced, match="no longer current"):
        await carry_out(Delivery(intent), Dispatch(NOW, "a1"), ledger, adapter_for(ledger, server, grants("steer")),
                        fence=Fence(stale, ledger.leases()))
    assert server.sent == []
    assert intent_view(ledger, intent.id).state == "proposed"


async def test_a_takeover_between_the_record_and_the_send_stops_the_send(ledger):
    """Paused after its dispatch record (``dispatch_recorded``): another daemon took the
    thread meanwhile; the re-check before the send refuses it."""
    intent = make_intent()
    proposed(ledger, intent)
    stale = ledger.leases().acquire(intent.thread_id, "daemon-a", SHORT)

    def paused_at(point: str) -> None:
        if point == "dispatch_recorded":
            lapse(stale)
            assert ledger.leases().acquire(intent.thread_id, "daemon-b", 30) is not None

    server = FakeAppServer(turn__steer={"turnId": "turn-1"})
    with pytest.raises(Fenced, match="lapsed before the send: nothing sent"):
        await carry_out(Delivery(intent), Dispatch(NOW, "a1"), ledger, adapter_for(ledger, server, grants("steer")),
                        paused_at, fence=Fence(stale, ledger.leases()))
    assert server.sent == []
    assert intent_view(ledger, intent.id).state == "dispatch_unknown"  # the next owner reconciles it


def test_the_keeper_takes_free_threads_renews_them_and_loses_a_lapsed_one(ledger):
    a = LeaseKeeper(ledger.leases(), SHORT, owner="host:1:a")
    b = LeaseKeeper(ledger.leases(), 30, owner="host:2:b")
    assert a.tick(["T", "U"], healthy=True).gained == ["T", "U"]
    assert b.tick(["T", "U", "V"], healthy=True).gained == ["V"]  # held by a: only the free one
    assert a.holds("T") and not a.ready("T")  # held, not read back yet: nothing decided for it
    a.reconciled(["T", "U"])
    assert a.ready("T")
    assert a.tick(["T", "U"], healthy=True).lost == []  # renewed in time
    assert a.tick([], healthy=False).lost == []  # unhealthy: renews nothing
    lapse(a.fence("T").lease)
    assert b.tick(["T", "U", "V"], healthy=True).gained == ["T", "U"]
    assert b.fence("T").lease.token == 2  # a new token: a's fence is refused from now on
    assert a.tick(["T", "U"], healthy=True).lost == ["T", "U"]
    assert not a.holds("T") and not a.ready("T")
    daemons = {d["id"]: d for d in ledger.leases().daemons()}
    assert set(daemons) == {"host:1:a", "host:2:b"} and daemons["host:2:b"]["alive"]
    b.leave()
    assert {d["id"] for d in ledger.leases().daemons()} == {"host:1:a"}
    assert a.tick(["T"], healthy=True).gained == ["T"]  # given up at once by b's clean stop


def test_leases_not_renewed_within_their_length_are_given_up_while_the_ledger_is_away(ledger):
    keeper = LeaseKeeper(ledger.leases(), 10.0, owner="host:1:a")
    started = time.monotonic()
    keeper.tick(["T"], healthy=True)
    keeper.reconciled(["T"])
    assert keeper.lapsed(now=started + 9.0) == [] and keeper.ready("T")  # may still stand: kept
    assert keeper.lapsed(now=started + 10.5) == ["T"]  # surely lapsed: nothing decided for it
    assert not keeper.holds("T") and not keeper.ready("T") and keeper.fence("T") is None
