"""The usage report: counted usage grouped by day, session, model or turn, priced
response by response (docs/usage/usage-and-budgets.md "`tillerman usage`").

The envelopes (a ledger's, or the folder reader's) go through the usage account
(``tillerman.ledger.usage_account``), which counts each response once and checks the sum
against the agents' own counters; this module adds what each ``add`` changed to the
rows it falls in. Cost is per response, because a long-context tier is decided by one
response's input: a row's cost is the sum of its responses' costs, and ``null`` with the
reasons when any response in it has no price (never 0 for what has no price). A duplicate
that replaces one counted before takes that one's figures and cost back from its rows.

Pure: no I/O; the command (``tillerman.controller.cli.usage``) reads and prints.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tillerman.controller.core.timefmt import iso
from tillerman.ledger.events import Envelope, Quarantined, Usage
from tillerman.ledger.usage import FIELDS, ZERO, Tokens
from tillerman.ledger.usage_account import Place, UsageAccount, out_of_range
from tillerman.monitor.tailer import FILE_SOURCE
from tillerman.rules.prices import Cost, PriceTable

BY_CHOICES = ("day", "session", "model", "turn")
FAST_SUFFIX = "-fast"  # the account names a fast response's model so (``Place.model``)


@dataclass(slots=True)
class Figures:
    """Token figures and their cost: ``usd`` sums the priced responses, ``unpriced``
    counts the responses with no price by (model, reason)."""

    tokens: Tokens = ZERO
    usd: float = 0.0
    unpriced: Counter = field(default_factory=Counter)

    def add(self, model: str | None, tokens: Tokens, cost: Cost, sign: int) -> None:
        """Adds (``sign`` 1) or takes back (-1) one response of ``model``."""
        self.tokens = self.tokens + tokens if sign > 0 else self.tokens - tokens
        if cost.usd is None:
            reason = (model, cost.missing)
            self.unpriced[reason] += sign
            if not self.unpriced[reason]:  # a withdrawal took the last one back
                del self.unpriced[reason]
        else:
            self.usd += sign * cost.usd

    def merge(self, other: Figures) -> None:
        self.tokens += other.tokens
        self.usd += other.usd
        if other.unpriced:  # most cells have none, and Counter.update is slow even when empty
            self.unpriced.update(other.unpriced)

    @property
    def cost_usd(self) -> float | None:
        return None if self.unpriced else self.usd

    def as_json(self) -> dict[str, Any]:
        too_large = out_of_range(self.tokens)
        figures = {name: None if name in too_large else getattr(self.tokens, name) for name in FIELDS}
        figures["total"] = None if "total" in too_large else self.tokens.total
        shown = {**figures, "cost_usd": self.cost_usd,
                 "cost_missing": [{"model": model, "reason": reason} for model, reason in sorted(
                     self.unpriced, key=lambda pair: (pair[0] or "", pair[1] or ""))]}
        if too_large:
            shown["out_of_range"] = list(too_large)
        return shown


@dataclass(slots=True)
class Activity(Figures):
    """Figures with when they were produced and where they were read."""

    first_at: float | None = None
    last_at: float | None = None
    sources: set = field(default_factory=set)  # "codex" | "claude"
    files: set = field(default_factory=set)

    def count(self, model: str | None, tokens: Tokens, cost: Cost, sign: int, envelope: Envelope | None) -> None:
        self.add(model, tokens, cost, sign)
        if envelope is None:  # a withdrawal: where and when it was counted stays
            return
        at = envelope.at
        if at is not None:
            self.first_at = at if self.first_at is None or at < self.first_at else self.first_at
            self.last_at = at if self.last_at is None or at > self.last_at else self.last_at
        self.sources.add(agent_of(envelope.event))
        if envelope.source.startswith(FILE_SOURCE):
            self.files.add(envelope.source[len(FILE_SOURCE):])

    def merge(self, other: Activity) -> None:
        Figures.merge(self, other)
        self.first_at = min(filter(None, (self.first_at, other.first_at)), default=None)
        self.last_at = max(filter(None, (self.last_at, other.last_at)), default=None)
        self.sources |= other.sources
        self.files |= other.files


@dataclass(slots=True)
class Row(Activity):
    """One row of the report: its figures, when it was active, and its models'."""

    models: dict = field(default_factory=dict)  # model -> Figures

    def take(self, model: str | None, cell: Activity) -> None:
        self.merge(cell)
        _figures_of(self.models, model).merge(cell)

    def as_json(self, key: dict[str, Any], *, breakdown: bool) -> dict[str, Any]:
        shown = {**key, **Figures.as_json(self), "first_activity": iso(self.first_at),
                 "last_activity": iso(self.last_at),
                 "models": sorted(m for m, f in self.models.items() if m is not None and not f.tokens.is_zero())}
        if breakdown:
            shown["breakdown"] = [{"model": model, **figures.as_json()} for model, figures in
                                  sorted(self.models.items(), key=lambda item: item[0] or "")
                                  if not figures.tokens.is_zero()]
        return shown


def _figures_of(split: dict, key: Any) -> Figures:
    found = split.get(key)
    if found is None:
        found = split[key] = Figures()
    return found


def agent_of(event: Usage) -> str:
    """"codex" or "claude", from the usage's source kind."""
    return "codex" if event.source_kind.startswith("codex") else "claude"


_KEYS: dict[str, Callable[[Place], tuple]] = {
    "day": lambda place: (place.day,),
    "session": lambda place: (place.thread_id,),
    "model": lambda place: (place.model,),
    "turn": lambda place: (place.thread_id, place.turn_id),
}


class UsageReport:
    """The report's rows, filled one envelope at a time (``add``), read with ``as_json``.

    Each response is counted in one cell (its row, model, thread and day): one addition
    a response, the rows summed from the cells at the end. ``since``/``until``:
    ``YYYY-MM-DD`` days in ``tz`` (both included); a response counts in the rows and
    totals when its day is in that span, as ccusage's ``--since/--until`` keep Codex
    events. Every response still goes through the account, so the two calculations are
    checked on whole threads. ``tz`` None: the system's zone. ``on_count``, when given,
    is told each change to a cell as it is made (its place, tokens, cost, and 1 to add or
    -1 to take back): what a live view such as the daemon's metrics follows without
    summing the cells again."""

    def __init__(self, prices: PriceTable, *, by: str = "day", tz: dt.tzinfo | None = None,
                 since: str | None = None, until: str | None = None, all_quarantines: bool = False,
                 on_count: Callable[[Place, Tokens, Cost, int], None] | None = None) -> None:
        self.prices, self.by, self.since, self.until = prices, by, since, until
        self._on_count = on_count
        self.account = UsageAccount(tz)  # type: ignore[arg-type]  (None: the system zone, as fromtimestamp reads it)
        self._key_of = _KEYS[by]
        # (row key, model, thread, day) -> its figures: what rows, totals and each thread's
        # cost are summed from, few enough to sum at the end whatever the folder's size.
        self.cells: dict[tuple, Activity] = {}
        self.quarantined: list[dict[str, Any]] = []
        self._all_quarantines = all_quarantines  # files read for usage only: every refused line is usage's

    def add_all(self, envelopes: Iterable[Envelope]) -> UsageReport:
        for envelope in envelopes:
            self.add(envelope)
        return self

    def add(self, envelope: Envelope) -> None:
        event = envelope.event
        if isinstance(event, Quarantined):
            if self._all_quarantines or event.reason.startswith("usage_"):
                self.quarantined.append({"file": _file(event.source), "offset": event.offset, "reason": event.reason})
            return
        counted = self.account.add(envelope)
        if counted is None or not isinstance(event, Usage):
            return
        if counted.withdrawn is not None:  # a better duplicate: the one counted elsewhere goes
            model, speed = _unplaced(counted.withdrawn.model)
            taken = counted.withdrawn_tokens
            self._count(counted.withdrawn, taken, self._cost(model, taken, speed), -1, None)
        elif counted.delta != event.tokens:  # a better duplicate, counted at the same place
            taken = event.tokens - counted.delta
            self._count(counted.place, taken, self._cost(event.model, taken, event.speed), -1, None)
        self._count(counted.place, event.tokens, self._cost(event.model, event.tokens, event.speed), 1, envelope)

    def _cost(self, model: str | None, tokens: Tokens, speed: str | None) -> Cost:
        """A response's cost. One of no tokens costs nothing whatever its model: Claude
        Code's ``<synthetic>`` entries (a local error, no model ran) would otherwise leave
        a day without a cost for want of a price nothing needed."""
        if tokens.is_zero():
            return Cost(usd=0.0, date=self.prices.date)
        return self.prices.cost(model, tokens, speed=speed)

    def _count(self, place: Place, tokens: Tokens, cost: Cost, sign: int, envelope: Envelope | None) -> None:
        where = (self._key_of(place), place.model, place.thread_id, place.day)
        cell = self.cells.get(where)
        if cell is None:
            cell = self.cells[where] = Activity()
        cell.count(place.model, tokens, cost, sign, envelope)
        if self._on_count is not None:
            self._on_count(place, tokens, cost, sign)

    def _in_span(self, day: str | None) -> bool:
        if self.since is None and self.until is None:
            return True
        return day is not None and (self.since or day) <= day <= (self.until or day)

    def rows(self) -> dict[tuple, Row]:
        """Each row's figures under its key (``(day,)``, ``(thread,)``, ``(model,)`` or
        ``(thread, turn)`` as ``by`` says), summed from the cells of days in the span."""
        rows: dict[tuple, Row] = {}
        for (key, model, _, day), cell in self.cells.items():
            if self._in_span(day):
                row = rows.get(key)
                if row is None:
                    row = rows[key] = Row()
                row.take(model, cell)
        return rows

    def as_json(self, *, breakdown: bool = False) -> dict[str, Any]:
        """The report as ``tillerman usage --json`` prints it."""
        rows = self.rows()
        totals = Figures()
        for row in rows.values():
            totals.merge(row)
        shown = [row.as_json(self._key(key, row), breakdown=breakdown)
                 for key, row in sorted(rows.items(), key=self._order) if not row.tokens.is_zero()]
        return {"by": self.by, "since": self.since, "until": self.until,
                "prices": {"date": self.prices.date, "source": self.prices.source, "digest": self.prices.digest},
                "rows": shown, "totals": totals.as_json(), "vendor": self._vendor(),
                "mismatches": [msgspec.to_builtins(m) for m in self.account.mismatches()],
                "quarantined": self.quarantined}

    def _key(self, key: tuple, row: Row) -> dict[str, Any]:
        if self.by == "session":
            return {"session": key[0], "source": "/".join(sorted(row.sources)) or None, "files": sorted(row.files),
                    **self.context(key[0])}
        if self.by == "turn":
            return {"session": key[0], "turn": key[1]}
        return {self.by: key[0]}

    def context(self, thread_id: str | None) -> dict[str, Any]:
        """How full the thread's context was at its last response: its input over the
        window the source named, else the price table's window for the response's model."""
        thread = self.account.threads.get(thread_id)
        if thread is None or thread.last_input is None:
            return {"last_input": None, "context_window": None, "context_use": None}
        window = thread.context_window
        if window is None and thread.last_model is not None:
            window = self.prices.context_window(thread.last_model)
        return {"last_input": thread.last_input, "context_window": window,
                "context_use": thread.last_input / window if window else None}

    def _order(self, item: tuple[tuple, Row]) -> tuple:
        key, row = item
        if self.by in ("day", "model"):
            return (key[0] is None, key[0] or "")
        return (row.first_at is None, row.first_at or 0.0, *(k or "" for k in key))

    def _vendor(self) -> list[dict[str, Any]]:
        """Each vendor's own cumulative figure for a thread beside ours (all days), and the difference."""
        reported = {thread_id for thread_id, thread in self.account.threads.items() if thread.reported}
        ours: dict[str | None, Figures] = {}
        for (_, _, thread_id, _), cell in self.cells.items():
            if thread_id in reported:  # summed only where there is a vendor figure to set it beside
                _figures_of(ours, thread_id).merge(cell)
        shown = []
        for thread_id, thread in self.account.threads.items():
            cost = ours.get(thread_id, Figures()).cost_usd
            for kind, envelope in sorted(thread.reported.items()):
                theirs = envelope.event.cost_usd
                shown.append({"session": thread_id, "source_kind": kind, "cost_usd": theirs, "our_cost_usd": cost,
                              "difference_usd": None if cost is None or theirs is None else cost - theirs})
        return shown


def _unplaced(model: str | None) -> tuple[str | None, str | None]:
    """A place's model back as the response named it, and its speed."""
    if model is not None and model.endswith(FAST_SUFFIX):
        return model[:-len(FAST_SUFFIX)], "fast"
    return model, None


def _file(source: str) -> str:
    return source[len(FILE_SOURCE):] if source.startswith(FILE_SOURCE) else source
