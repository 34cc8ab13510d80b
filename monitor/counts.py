"""Counting, defined once for every format, over the normalized event stream.

- ``turns``: turn starts seen;
- ``interrupted_turns``: turns ended by an interruption;
- ``unclosed_turns``: turns with no end before the next turn start on the same
  thread, or before the end of the stream;
- ``threads``: distinct thread ids;
- ``events``: normalized events, quarantine records excluded;
- ``quarantined``: quarantine records.

(``records``, the lines read, is counted by the parser.)
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from tillerman.ledger.events import Event, Quarantined, TurnCompleted, TurnStarted


class Counts(msgspec.Struct, frozen=True, kw_only=True):
    events: int = 0
    quarantined: int = 0
    threads: int = 0
    turns: int = 0
    interrupted_turns: int = 0
    unclosed_turns: int = 0


class EventCounter:
    """Counts incrementally; ``counts()`` treats the stream as ended."""

    def __init__(self) -> None:
        self._events = 0
        self._quarantined = 0
        self._threads: set[str | None] = set()
        self._turns = 0
        self._interrupted = 0
        self._unclosed = 0
        self._open: dict[str | None, set[str | None]] = {}  # thread → turns started, not ended

    def add(self, event: Event) -> None:
        if isinstance(event, Quarantined):
            self._quarantined += 1
            return
        self._events += 1
        thread_id = event.thread_id
        if thread_id is not None:
            self._threads.add(thread_id)
        if isinstance(event, TurnStarted):
            open_turns = self._open.setdefault(thread_id, set())
            if event.turn_id in open_turns:
                return  # the same start reported twice
            self._unclosed += len(open_turns)  # a new turn ends any the thread left open
            open_turns.clear()
            open_turns.add(event.turn_id)
            self._turns += 1
        elif isinstance(event, TurnCompleted):
            open_turns = self._open.get(thread_id)
            if open_turns is not None and event.turn_id in open_turns:
                open_turns.discard(event.turn_id)
                if event.status == "interrupted":
                    self._interrupted += 1

    def counts(self) -> Counts:
        return Counts(
            events=self._events, quarantined=self._quarantined, threads=len(self._threads),
            turns=self._turns, interrupted_turns=self._interrupted,
            unclosed_turns=self._unclosed + sum(len(t) for t in self._open.values()),
        )


def count(events: Iterable[Event]) -> Counts:
    counter = EventCounter()
    for event in events:
        counter.add(event)
    return counter.counts()
