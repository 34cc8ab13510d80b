"""The scale benchmark's load: the fake app-server's threads are staggered across a turn,
as independent sessions are, unless asked to run in lockstep (the worst burst). The
flood is driven here without a socket or a wait: ``notify`` records what would be sent,
and each of the flood's sleeps moves the server's clock on by the time it asked for."""

from __future__ import annotations

import asyncio
import itertools
import time
import types

import pytest

from fixtures import fake_appserver
from fixtures.fake_appserver import TICK, TURN_NOTIFICATIONS, FakeAppServer

RATE = 50.0


def test_a_turn_is_the_length_the_stagger_assumes():
    server = FakeAppServer(1, RATE)
    thread = next(iter(server.threads.values()))
    methods = [method for method, _ in itertools.islice(thread.script, 2 * TURN_NOTIFICATIONS)]
    assert methods[1] == methods[TURN_NOTIFICATIONS + 1] == "turn/started"
    assert methods.count("turn/started") == 2 and methods[TURN_NOTIFICATIONS - 1] == "turn/completed"


class _Enough(Exception):
    pass


def _turn_starts(monkeypatch, threads: int, *, lockstep: bool, seconds: float) -> list[float]:
    """When each thread's first turn/started falls due, in seconds after the flood starts.
    The server's clock is the flood's sleeps alone: a busy machine's own time passing
    between two looks must not move a thread's start."""
    elapsed = [0.0]
    monkeypatch.setattr(fake_appserver, "time", types.SimpleNamespace(monotonic=lambda: elapsed[0], time=time.time))
    server = FakeAppServer(threads, RATE, lockstep=lockstep)
    starts: dict[str, float] = {}

    async def notify(thread, method, params):
        if method == "turn/started":
            starts.setdefault(thread.id, elapsed[0])

    async def tick(seconds_asked):  # the flood's sleep: the clock moves on by one tick, at once
        elapsed[0] += seconds_asked
        if elapsed[0] >= seconds:
            raise _Enough

    server.notify = notify
    monkeypatch.setattr(fake_appserver, "asyncio", types.SimpleNamespace(sleep=tick))
    with pytest.raises(_Enough):
        asyncio.run(server.flood())
    return sorted(starts.values())


@pytest.mark.parametrize("lockstep", [False, True])
def test_turns_start_spread_over_a_turn_or_all_at_once(monkeypatch, lockstep):
    turn = TURN_NOTIFICATIONS / RATE
    starts = _turn_starts(monkeypatch, 40, lockstep=lockstep, seconds=2 * turn)
    assert len(starts) == 40
    if lockstep:
        assert starts[-1] - starts[0] <= 1 / RATE + TICK  # within one interval
    else:
        assert starts[-1] - starts[0] >= 0.9 * turn  # across the whole turn, evenly
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert max(gaps) <= turn / 40 + 2 * TICK
