from tillerman.ledger.events import Quarantined, ThreadStarted, TurnCompleted, TurnStarted, UserMessage
from tillerman.monitor.counts import Counts, EventCounter, count


def test_counts_turns_interruptions_and_unclosed_turns_per_thread():
    evs = [
        ThreadStarted(thread_id="a"),
        TurnStarted(thread_id="a", turn_id="1"),
        TurnCompleted(thread_id="a", turn_id="1", status="interrupted"),
        TurnStarted(thread_id="a", turn_id="2"),  # never ends: the next start leaves it unclosed
        TurnStarted(thread_id="b", turn_id="1"),  # same id, other thread: a different turn
        TurnStarted(thread_id="a", turn_id="3"),
        TurnCompleted(thread_id="a", turn_id="3", status="completed"),
        TurnCompleted(thread_id="a", turn_id="3", status="completed"),  # a second report of the same end
        TurnCompleted(thread_id="a", turn_id="9", status="interrupted"),  # an end whose start was not seen
        UserMessage(thread_id="b", turn_id="1", digest="sha256:x", size=1),
        Quarantined(source="f", offset=0, length=3, reason="invalid_json"),
    ]
    assert count(evs) == Counts(events=10, quarantined=1, threads=2, turns=4, interrupted_turns=1,
                                unclosed_turns=2)  # "a"/2 before "a"/3, and "b"/1 at the end of the stream


def test_a_repeated_start_is_one_turn():
    counter = EventCounter()
    for event in (TurnStarted(thread_id="a", turn_id="1"), TurnStarted(thread_id="a", turn_id="1")):
        counter.add(event)
    assert (counter.counts().turns, counter.counts().unclosed_turns) == (1, 1)
    counter.add(TurnCompleted(thread_id="a", turn_id="1"))
    assert counter.counts().unclosed_turns == 0


def test_nothing_counts_nothing():
    assert count([]) == Counts()
