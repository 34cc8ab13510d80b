"""A turn listing read again past a turn that was just starting (Codex 0.171 lists one as
``interrupted`` with ``completedAt: null`` for a few milliseconds, and one that died with
its server so for good)."""

from __future__ import annotations

import pytest

from tillerman.controller.dispatch import turn_listing
from tillerman.controller.dispatch.turn_listing import settled_listing
from tillerman.monitor.codex_wire import parse_turn_page

pytestmark = pytest.mark.anyio

STARTING = {"id": "t", "status": "interrupted", "completedAt": None}
RUNNING = {"id": "t", "status": "inProgress", "completedAt": None}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(("listed", "undecided"), [
    (STARTING, True),  # 0.171: a turn just starting, or one that died with its server
    ({"id": "t", "status": "interrupted", "completedAt": 1796562365}, False),
    ({"id": "t", "status": "interrupted"}, False),  # a release that lists no end time
    (RUNNING, False),
    ({"id": "t", "status": "completed", "completedAt": None}, False),
])
def test_only_an_interrupted_turn_listed_with_a_null_end_time_is_undecided(listed: dict, undecided: bool) -> None:
    [turn] = parse_turn_page({"data": [listed]}).turns
    assert turn.undecided is undecided


class Server:
    """Answers each listing with the next page of a script, counting the requests."""

    def __init__(self, *pages: dict) -> None:
        self.pages = list(pages)
        self.asked = 0

    async def list(self) -> dict:
        self.asked += 1
        return self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]


@pytest.fixture(autouse=True)
def no_wait(monkeypatch) -> None:
    monkeypatch.setattr(turn_listing, "RELIST_AFTER", 0.0)


@pytest.mark.parametrize(("pages", "asked", "settled"), [
    ([{"data": [RUNNING]}], 1, RUNNING),  # nothing undecided: one read
    ([{"data": [STARTING]}, {"data": [RUNNING]}], 2, RUNNING),  # it was starting: running now
    ([{"data": [STARTING]}], 2, STARTING),  # still so: it died with its server, and has ended
    ([{"data": [RUNNING, STARTING]}], 1, RUNNING),  # below a newer turn it has ended: one read
    ([{"data": "garbage"}], 1, None),  # unreadable: no second read, the caller judges it
])
async def test_a_listing_with_an_undecided_turn_is_read_once_more(pages, asked, settled) -> None:
    server = Server(*pages)
    reply = await settled_listing(server.list)
    assert server.asked == asked
    assert (reply["data"][0] if isinstance(reply["data"], list) else None) == settled
