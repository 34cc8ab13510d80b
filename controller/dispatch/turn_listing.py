"""A ``thread/turns/list`` reply, read again past a turn that was just starting.

Codex 0.171 lists a turn that is just starting as ``interrupted`` with ``completedAt:
null`` for a few milliseconds, and a turn that died with its server the same way for
good (``Turn.undecided``). One listing cannot tell them apart, and what follows from it
differs: the first runs (taken for ended, a daemon attaching in that moment lost the
running turn, and a queued message that had just started it would be settled
``not_delivered``), the second has ended (a steer accepted into it was lost, and a stop
must not wait for it). So a listing that shows such a turn is read once more,
``RELIST_AFTER`` seconds later: a starting turn is ``inProgress`` by then, and a turn
still listed so has ended. Only the newest listed turn can be starting (the listing is
newest first): an undecided turn below another has ended, and costs no second read.
The deciding code downstream reads a settled listing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from tillerman.monitor.codex_wire import Turn, parse_turn_page

#: Seconds before a listing with an undecided turn is read again: far longer than the
#: milliseconds a turn is listed so while it starts, even on a loaded machine.
RELIST_AFTER = 0.5


async def settled_listing(request: Callable[[], Awaitable[Any]]) -> Any:
    """The reply of ``request()`` (a ``thread/turns/list``), asked again once after
    ``RELIST_AFTER`` seconds when its newest turn is undecided."""
    reply = await request()
    if starting(parse_turn_page(reply).turns):
        await anyio.sleep(RELIST_AFTER)
        reply = await request()
    return reply


def starting(turns: Sequence[Turn]) -> bool:
    """Whether the newest of ``turns`` (a listing, newest first) may be just starting."""
    return bool(turns) and turns[0].undecided
