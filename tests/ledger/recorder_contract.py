"""The contract every ledger backend must keep. A backend's test module subclasses
``RecorderContract`` and supplies only ``make_recorder`` (and, for a ledger other
processes can write, ``second_writer``; for one several daemons share, ``shares_daemons``).

What only some backends can do is declared on ``Recorder`` with a default; the checks
from ``test_the_change_feed_tells_of_another_writer`` on hold each backend to what it
declares, so a caller asks the interface and never the backend's type.

A backend that keeps only its chain head (``Recorder.retains_rows`` False) keeps the
same contract for what ``append`` returns, de-duplication and intent transitions; the
checks that read rows back run only where rows are kept (``kept_rows``)."""

from __future__ import annotations

import itertools

import anyio
import pytest

from tillerman.ledger.errors import IllegalTransition
from tillerman.ledger.events import Conflict, Envelope, IntentProposed, IntentTransition, TurnStarted
from tillerman.ledger.file_offsets import FileOffset
from tillerman.ledger.intents import Intent


def turn(i: int, *, thread: str = "t1", source: str = "test") -> Envelope:
    return Envelope(event_id=f"e{i}", event=TurnStarted(thread_id=thread, turn_id=f"u{i}"), source=source, at=float(i))


def make_intent(intent_id: str = "in-00000000000000000001") -> Intent:
    return Intent(id=intent_id, thread_id="t1", mode="steer", text="x", text_digest="d",
                  created_at=0.0, ack_deadline=10.0, expires_at=100.0, expected_turn_id="u1")


def proposed(intent: Intent) -> Envelope:
    return Envelope(event_id=f"{intent.id}:p", event=IntentProposed(thread_id="t1", intent=intent), source="tillerman")


def moved(intent: Intent, frm: str, to: str, reason: str, suffix: str = "") -> Envelope:
    return Envelope(
        event_id=f"{intent.id}:{frm}>{to}{suffix}",
        event=IntentTransition(thread_id="t1", intent_id=intent.id, from_state=frm, to_state=to, reason=reason),
        source="tillerman",
    )


def kept_rows(recorder, after_seq: int = 0):
    """The rows ``read`` yields, or None from a backend that keeps none."""
    return list(recorder.read(after_seq=after_seq)) if recorder.retains_rows else None


class RecorderContract:
    #: Whether the backend holds thread leases for several daemons (``Recorder.leases``).
    shares_daemons = False

    def make_recorder(self, tmp_path):  # pragma: no cover - supplied by each backend
        raise NotImplementedError

    def second_writer(self, recorder):
        """Another recorder on the same ledger, as another process would open it; None
        where no other process can reach the ledger (in memory)."""
        return None

    @pytest.fixture
    def recorder(self, tmp_path):
        rec = self.make_recorder(tmp_path)
        yield rec
        assert rec.verify().ok, rec.verify().problems  # the chain holds after every case
        rec.close()

    def test_empty_append_writes_nothing(self, recorder):
        assert recorder.append([]).seqs == ()
        assert recorder.max_seq() == 0

    def test_seqs_are_contiguous_and_ordered(self, recorder):
        assert recorder.append([turn(1), turn(2)]).seqs == (1, 2)
        assert recorder.append([turn(3)]).seqs == (3,)
        assert recorder.max_seq() == 3
        if not recorder.retains_rows:
            return
        assert [e.seq for e in recorder.read()] == [1, 2, 3]
        assert [e.envelope.event_id for e in recorder.read(after_seq=1)] == ["e2", "e3"]
        assert [e.seq for e in recorder.read(after_seq=0, limit=2)] == [1, 2]

    def test_identical_duplicate_is_a_silent_no_op(self, recorder):
        recorder.append([turn(1)])
        result = recorder.append([turn(1), turn(1)])
        assert result.seqs == () and result.duplicates == 2 and result.conflicts == ()
        assert recorder.max_seq() == 1

    def test_duplicate_with_new_observed_time_is_still_identical(self, recorder):
        first = turn(1)
        recorder.append([first])
        again = Envelope(event_id="e1", event=first.event, source="test", at=1.0, observed_at=12345.0)
        assert recorder.append([again]).duplicates == 1

    def test_same_id_different_content_is_recorded_as_conflict(self, recorder):
        recorder.append([turn(1)])
        changed = Envelope(event_id="e1", event=TurnStarted(thread_id="t1", turn_id="other"), source="test", at=1.0)
        result = recorder.append([changed])
        assert result.conflicts == ("e1",)
        assert [type(e.envelope.event) for e in result.entries] == [Conflict]
        entries = kept_rows(recorder)
        assert entries is None or entries[0].envelope.event.turn_id == "u1"  # never overwritten
        assert recorder.append([changed]).seqs == ()  # the same conflict is recorded once

    def test_illegal_transition_writes_nothing_of_the_batch(self, recorder):
        intent = make_intent()
        recorder.append([proposed(intent)])
        before = recorder.max_seq()
        with pytest.raises(IllegalTransition):
            recorder.append([turn(9), moved(intent, "proposed", "acknowledged", "echo")])
        assert recorder.max_seq() == before

    def test_intent_events_offered_again_are_duplicates_not_refusals(self, recorder):
        intent = make_intent()
        batch = [proposed(intent), moved(intent, "proposed", "dispatch_unknown", "dispatching")]
        recorder.append(batch)
        result = recorder.append([*batch, turn(1)])
        assert result.duplicates == 2 and result.seqs == (3,)

    def test_transition_must_start_from_the_current_state(self, recorder):
        intent = make_intent()
        recorder.append([proposed(intent), moved(intent, "proposed", "dispatch_unknown", "dispatching")])
        with pytest.raises(IllegalTransition, match="moved meanwhile"):
            recorder.append([moved(intent, "proposed", "expired", "cancelled")])

    def test_transitions_within_one_batch_chain(self, recorder):
        intent = make_intent()
        recorder.append([
            proposed(intent),
            moved(intent, "proposed", "dispatch_unknown", "dispatching"),
            moved(intent, "dispatch_unknown", "queued", "accepted"),
        ])
        recorder.append([moved(intent, "queued", "acknowledged", "echo")])  # the state the batch left
        if recorder.retains_rows:
            assert [e.envelope.event_id for e in recorder.intent_entries(intent.id)][-1].endswith("acknowledged")

    def test_snapshot_round_trip_keeps_the_latest(self, recorder):
        assert recorder.load_snapshot("p") is None
        recorder.save_snapshot("p", 5, b"five")
        recorder.save_snapshot("p", 3, b"older")  # a slower writer never moves it back
        assert recorder.load_snapshot("p") == (5, b"five")

    def test_file_offsets_go_with_their_events_and_the_last_per_file_wins(self, recorder):
        def at(offset: int, identity: str = "d:1:abc") -> FileOffset:
            return FileOffset(identity=identity, path="/s/a.jsonl", source="file:/s/a.jsonl",
                              format="codex-rollout", offset=offset)

        assert recorder.file_offsets() == []
        recorder.append([turn(1)], offsets=[at(10), at(20)])
        recorder.append([], offsets=[at(5, "d:2:def")])  # a span that held only a partial line
        assert [(o.identity, o.offset) for o in recorder.file_offsets()] == [("d:1:abc", 20), ("d:2:def", 5)]
        assert all(o.updated_at > 0 for o in recorder.file_offsets())
        intent = make_intent()
        recorder.append([proposed(intent)])
        with pytest.raises(IllegalTransition):  # a refused batch keeps no offset either
            recorder.append([moved(intent, "proposed", "acknowledged", "echo")], offsets=[at(99)])
        assert [o.offset for o in recorder.file_offsets() if o.identity == "d:1:abc"] == [20]

    def test_a_negative_zero_time_verifies_and_stays_the_same_fact(self, recorder):
        """SQLite reads -0.0 back as 0: the chain is of the time as it reads back."""
        first = Envelope(event_id="e-zero", event=TurnStarted(thread_id="t1", turn_id="u1"), source="test",
                         at=-0.0, observed_at=-0.0)
        recorder.append([first])
        assert recorder.verify().ok
        assert recorder.append([first]).seqs == ()  # offered again: the same fact, not a conflict
        assert recorder.verify().ok

    def test_append_returns_the_entries_read_yields(self, recorder):
        """A writer folds what ``append`` returns instead of reading it back: those entries
        must be the stored rows exactly (seq, chain links, the envelope as stored)."""
        intent = make_intent()
        recorder.append([turn(1)])
        changed = Envelope(event_id="e1", event=TurnStarted(thread_id="t1", turn_id="other"), source="test", at=1.0)
        odd = Envelope(event_id="e-odd", event=TurnStarted(thread_id="t\u00e9\U0001f600\x00", turn_id="u\u2028"),
                       source="file:/s/a.jsonl", at=-0.0, offset=7, length=3)
        evidence = Envelope(
            event_id=f"{intent.id}:ev",
            event=IntentTransition(thread_id="t1", intent_id=intent.id, from_state="proposed",
                                   to_state="dispatch_unknown", reason="dispatching",
                                   evidence={"turn_id": "u1", "n": 3, "x": 0.1, "ok": True, "none": None}),
            source="tillerman", at=2.5)
        batches = [[turn(2), turn(1), changed, odd], [proposed(intent), evidence], [turn(2)]]
        returned = []
        for batch in batches:
            result = recorder.append(batch, offsets=[])
            assert result.seqs == tuple(e.seq for e in result.entries)
            returned.extend(result.entries)
        assert [e.seq for e in returned] == [2, 3, 4, 5, 6]  # duplicates write nothing, a conflict is a row
        assert kept_rows(recorder, after_seq=1) in (returned, None)
        assert all(e.envelope.observed_at is not None for e in returned)

    def test_appends_in_bulk_are_whole_and_kept(self, recorder):
        """``bulk()``: one commit for many appends; each returns its entries at once, a
        refused one adds nothing, and the rest are kept even when the block raises."""
        intent = make_intent()
        returned = []
        with pytest.raises(IllegalTransition), recorder.bulk():
            returned += recorder.append([turn(1)]).entries
            returned += recorder.append([turn(1), turn(2)]).entries  # a duplicate within the block
            returned += recorder.append([proposed(intent)]).entries
            returned += recorder.append([moved(intent, "proposed", "dispatch_unknown", "dispatching")]).entries
            recorder.append([turn(3), moved(intent, "proposed", "expired", "cancelled")])  # moved meanwhile
        assert [e.seq for e in returned] == [1, 2, 3, 4]
        assert kept_rows(recorder) in (returned, None)
        with recorder.bulk():
            assert recorder.append([turn(3)]).seqs == (5,)
        assert recorder.max_seq() == 5

    # -- declared capabilities ----------------------------------------------------

    def test_the_change_feed_tells_of_another_writer(self, recorder):
        """A ledger another process can write has a change feed, and the feed goes round
        after that process commits; one no other process can reach has none."""
        other = self.second_writer(recorder)
        feed = recorder.change_feed()
        assert (feed is None) == (other is None)
        if feed is None:
            return
        try:
            anyio.run(_one_round, feed, other)
        finally:
            feed.close()
            other.close()
        assert recorder.max_seq() > 0

    def test_history_is_what_read_yields_where_nothing_was_moved(self, recorder):
        if not recorder.retains_rows:
            return
        intent = make_intent()
        recorder.append([turn(1), proposed(intent), turn(2)])
        assert list(recorder.history()) == list(recorder.read())
        assert [e.seq for e in recorder.history(after_seq=1, kinds=("turn_started",))] == [3]

    def test_append_new_appends_as_declared(self, recorder):
        """``append_new`` of new events writes the rows ``append`` would; a backend that
        keeps their ids (``forgets_new_ids`` False) knows them again as duplicates."""
        result = recorder.append_new([turn(1), turn(2)])
        assert result.seqs == (1, 2) and recorder.max_seq() == 2
        assert kept_rows(recorder) in (list(result.entries), None)
        again = recorder.append([turn(1)])
        if not recorder.forgets_new_ids:
            assert again.duplicates == 1 and again.seqs == ()
        assert recorder.chains_new or recorder.forgets_new_ids  # only a ledger that forgets may leave a row unchained

    def test_append_off_loop_appends(self, recorder):
        async def append():
            return await recorder.append_off_loop([turn(1)], durable=True)

        assert anyio.run(append).seqs == (1,)
        assert recorder.max_seq() == 1

    def test_leases_are_there_where_several_daemons_share_the_ledger(self, recorder):
        """Thread leases where several daemons may follow the ledger; elsewhere None
        (one daemon owns it, by its lock file), so a daemon asks for no lease there."""
        leases = recorder.leases()
        assert (leases is not None) == self.shares_daemons
        if leases is not None:
            assert leases.daemons() == []  # a ledger made for the test: no daemon took its place

    def test_capabilities_a_backend_lacks_are_their_defaults(self, recorder):
        assert recorder.daemon_running() is False  # no daemon follows a ledger made for the test
        assert recorder.damage is None
        recorder.checkpoint_in_background()
        try:
            assert recorder.append([turn(1)]).seqs == (1,)
        finally:
            recorder.checkpoint_in_commits()
        assert recorder.append([turn(2)]).seqs == (2,)


async def _one_round(feed, other) -> None:
    """Commit through ``other`` until ``feed`` goes round (a feed may need a moment to
    start watching; a commit before that is not its to tell)."""
    rounds = aiter(feed)

    async def keep_committing() -> None:
        for i in itertools.count(1):
            other.append([turn(i, thread="other")])
            await anyio.sleep(0.1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(keep_committing)
        with anyio.fail_after(20):
            await anext(rounds)
        tg.cancel_scope.cancel()
    await rounds.aclose()
