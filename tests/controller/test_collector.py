"""The daemon's collector: survivors frozen at each heartbeat, young garbage freed first,
and everything collected once an hour."""

import gc
import weakref

import pytest

from tillerman.controller.daemon.collector import FULL_EVERY, Collector


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture(autouse=True)
def thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()


def _tracked(obj) -> bool:
    """Whether the collector still walks ``obj`` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def test_a_heartbeat_freezes_what_survived_out_of_the_collectors_sight():
    kept = Node()
    assert _tracked(kept)
    Collector(0.0).settle(5.0)
    assert not _tracked(kept)
    assert gc.get_freeze_count() > 0


def test_young_garbage_is_freed_not_frozen():
    dropped = weakref.ref(Node())
    Collector(0.0).settle(5.0)
    assert dropped() is None


def test_garbage_frozen_before_it_was_dropped_is_freed_by_the_hourly_full_pass():
    collector = Collector(0.0)
    node = Node()
    dropped = weakref.ref(node)
    collector.settle(5.0)  # frozen while alive
    del node
    collector.settle(10.0)
    assert dropped() is not None  # out of sight until the full pass
    collector.settle(FULL_EVERY + 1.0)
    assert dropped() is None
