"""One thread's page: its fleet row, turns, tool calls, approvals waiting,
findings, every intent with its journey, the reviewer's calls and answers, and usage;
with --retain-payloads, also the calls' commands and the agent's messages.

A pure function of the folded facts (``tillerman.controller.report.fold``: the ledger's
projection, the reviews and the usage account in one fold), the fleet's sightings and
the time now. Every list is paged (``page``, ``limit``; newest first), so a thread of
thousands of turns is a page of them; ``ThreadView.counts`` says how many there are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from tillerman.controller.dashboard.fleet import FleetRow, Seen, fleet_row, item_type_words
from tillerman.controller.report.fold import STALL_FINDING, Facts
from tillerman.controller.report.usage import Figures, UsageReport
from tillerman.ledger.projections import HistoryItem

#: A page's rows unless the caller asks for another number, and the most it may ask for.
LIMIT = 50
MAX_LIMIT = 500
#: ``tillerman.rules.detect``'s finding for one command failing again and again: a loop.
LOOP_FINDING = re.compile(r" failed \d+ times with the same arguments")


class TurnRow(msgspec.Struct, frozen=True, kw_only=True):
    turn_id: str
    state: str  # "completed" | "interrupted" | "failed" | "open"
    started_at: float | None
    ended_at: float | None
    trigger: str | None  # "user" | "goal" | "queue" | "unknown"; None: not known
    trigger_inferred: bool
    writer: str | None  # who opened it, where the ledger still knows (its recent turns)


class CallRow(msgspec.Struct, frozen=True, kw_only=True):
    item_id: str
    turn_id: str | None
    tool: str  # its tool, else its type in words
    command: str | None  # a shell call's command line: only with --retain-payloads
    critical: bool
    started_at: float | None
    ended_at: float | None
    status: str  # the completion's status; "running" while none is recorded
    exit_code: int | None


class MessageRow(msgspec.Struct, frozen=True, kw_only=True):
    turn_id: str | None
    at: float | None
    text: str  # the agent's words, kept only with --retain-payloads: escaped wherever shown


class Approval(msgspec.Struct, frozen=True, kw_only=True):
    item_id: str
    since: float | None


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    seq: int  # its ``report`` row
    event_id: str  # that row's event id: a label names the finding by it (``finding:EVENT_ID``)
    at: float | None
    kind: str  # "stall" | "loop" | "budget" | "other"
    rule_id: str
    turn_id: str | None
    finding: str
    action: str | None
    shadow: bool
    intent_id: str | None


class IntentRow(msgspec.Struct, frozen=True, kw_only=True):
    intent_id: str
    mode: str
    state: str
    producer: str
    created_at: float
    updated_at: float | None
    open: bool
    journey: tuple[HistoryItem, ...]  # each move, evidence and decision, with its time and reason


class ReviewRow(msgspec.Struct, frozen=True, kw_only=True):
    checkpoint_id: str
    checkpoint: str
    reviewer: str
    intent_id: str | None
    asked_at: float | None
    outcome: str | None  # None: asked, no answer recorded
    disposition: str | None
    recommended_action: str | None
    cost_usd: float | None
    probe: bool


class UsageLine(msgspec.Struct, frozen=True, kw_only=True):
    key: str | None  # the model, turn or day
    tokens: int
    cost_usd: float | None  # None: a response in it has no known price


class Spending(msgspec.Struct, frozen=True, kw_only=True):
    tokens: int
    cost_usd: float | None
    context_use: float | None
    by_model: tuple[UsageLine, ...]
    by_day: tuple[UsageLine, ...]
    by_turn: tuple[UsageLine, ...]  # paged with the turns' page


class ThreadView(msgspec.Struct, frozen=True, kw_only=True):
    thread_id: str
    header: FleetRow | None  # None: a thread no one supervises (Codex's housekeeping) or not seen
    turns: tuple[TurnRow, ...]
    tool_calls: tuple[CallRow, ...]
    messages: tuple[MessageRow, ...]  # the agent's retained messages; none without --retain-payloads
    approvals: tuple[Approval, ...]  # waiting on the owner now (never paged: the server has few)
    findings: tuple[Finding, ...]
    intents: tuple[IntentRow, ...]
    reviews: tuple[ReviewRow, ...]
    usage: Spending
    counts: dict[str, int]  # every list's full length, for the page's "more"
    page: int
    limit: int


def thread_view(facts: Facts, seen: dict[str, Seen], usage_today: UsageReport, thread_id: str, now: float, *,
                page: int = 0, limit: int = LIMIT, resolved_at: Mapping[str, float] | None = None) -> ThreadView:
    """The page of ``thread_id``. ``facts``: the ledger folded (``fold_facts``);
    ``seen`` and ``usage_today``: what ``fleet_row`` reads (``Sightings.threads``, the
    usage report of today by session, the notices resolved). ``page`` counts from 0, newest
    first; ``limit`` is held to ``MAX_LIMIT``. The timeline is not here: the page links to
    the timeline's own route, which draws it when asked."""
    limit = max(1, min(limit, MAX_LIMIT))
    page = max(0, page)
    projection = facts.projection
    thread = projection.threads.get(thread_id)
    header = fleet_row(projection, usage_today, now, seen, thread_id, resolved_at=resolved_at)
    turns = sorted((t for t in facts.turns.values() if t.thread_id == thread_id),
                   key=lambda t: (t.started_at or t.ended_at or 0.0, t.seq), reverse=True)
    calls = sorted((c for c in facts.calls.values() if c.thread_id == thread_id), key=lambda c: c.seq, reverse=True)
    findings = [r for r in reversed(facts.reports) if r.thread_id == thread_id]
    said = [m for m in reversed(facts.said) if m.thread_id == thread_id]
    budget_seqs = {b.seq for b in facts.budget_crossings}
    intents = sorted((v for v in projection.intents.values() if v.intent.thread_id == thread_id),
                     key=lambda v: (v.intent.created_at, v.intent.id), reverse=True)
    reviews = sorted((c for c in facts.reviews.checkpoints.values() if c.thread_id == thread_id),
                     key=lambda c: c.pending_at or 0.0, reverse=True)
    shown_turns = _page(turns, page, limit)
    writers = thread.turn_writers if thread is not None else {}
    return ThreadView(
        thread_id=thread_id, header=header,
        turns=tuple(TurnRow(turn_id=t.turn_id, state=t.status or "open", started_at=t.started_at,
                            ended_at=t.ended_at, trigger=facts.trigger(t)[0], trigger_inferred=facts.trigger(t)[1],
                            writer=writers.get(t.turn_id)) for t in shown_turns),
        tool_calls=tuple(CallRow(item_id=c.item_id, turn_id=c.turn_id, tool=c.tool or item_type_words(c.item_type),
                                 command=c.command, critical=c.critical, started_at=c.started_at,
                                 ended_at=c.ended_at, status=c.status or "running", exit_code=c.exit_code)
                         for c in _page(calls, page, limit)),
        messages=tuple(MessageRow(turn_id=m.turn_id, at=m.at, text=m.text) for m in _page(said, page, limit)),
        approvals=tuple(Approval(item_id=item, since=since) for item, since in
                        sorted((thread.approvals if thread is not None else {}).items(), key=lambda a: a[1] or 0.0)),
        findings=tuple(Finding(seq=r.seq, event_id=r.event_id, at=r.at,
                               kind=_finding_kind(r.finding, r.seq in budget_seqs), rule_id=r.rule_id,
                               turn_id=r.turn_id, finding=r.finding, action=r.action, shadow=r.shadow,
                               intent_id=r.intent_id) for r in _page(findings, page, limit)),
        intents=tuple(IntentRow(intent_id=v.intent.id, mode=v.intent.mode, state=str(v.state),
                                producer=v.intent.producer, created_at=v.intent.created_at, updated_at=v.updated_at,
                                open=v.intent.id in projection.open_ids, journey=tuple(v.history))
                      for v in _page(intents, page, limit)),
        reviews=tuple(_review(c) for c in _page(reviews, page, limit)),
        usage=_usage(facts, thread_id, [t.turn_id for t in shown_turns], header),
        counts={"turns": len(turns), "tool_calls": len(calls), "messages": len(said), "findings": len(findings),
                "intents": len(intents), "reviews": len(reviews)},
        page=page, limit=limit)


def _page(items: list, page: int, limit: int) -> list:
    return items[page * limit:(page + 1) * limit]


def _finding_kind(finding: str, budget: bool) -> str:
    if budget:
        return "budget"
    if STALL_FINDING.match(finding):
        return "stall"
    return "loop" if LOOP_FINDING.search(finding) else "other"


def _review(c) -> ReviewRow:
    answer = c.committed
    return ReviewRow(checkpoint_id=c.checkpoint_id, checkpoint=c.checkpoint, reviewer=c.reviewer,
                     intent_id=c.intent_id, asked_at=c.pending_at, outcome=answer.outcome if answer else None,
                     disposition=answer.disposition if answer else None,
                     recommended_action=answer.recommended_action if answer else None,
                     cost_usd=answer.cost_usd if answer else None, probe=c.probe)


def _usage(facts: Facts, thread_id: str, turn_ids: list[str], header: FleetRow | None) -> Spending:
    """The thread's tokens and cost, all days, by model, day and the shown turns: summed
    from the usage report's cells (each response priced once, as ``tillerman usage``)."""
    total, by_model, by_day, by_turn = Figures(), {}, {}, {}
    for (key, model, thread, day), cell in facts.usage.cells.items():
        if thread != thread_id:
            continue
        total.merge(cell)
        for split, at in ((by_model, model), (by_day, day), (by_turn, key[1])):
            split.setdefault(at, Figures()).merge(cell)
    canonical = facts.projection.threads.get(thread_id)
    turns: dict[str | None, Figures] = {}
    for turn, figures in by_turn.items():  # a turn two sources name differently is one turn
        turns.setdefault(canonical.canonical_turn(turn) if canonical is not None else turn, Figures()).merge(figures)
    return Spending(
        tokens=total.tokens.total, cost_usd=total.cost_usd,
        context_use=header.context_use if header is not None else None,
        by_model=_lines(by_model), by_day=_lines(by_day),
        by_turn=tuple(UsageLine(key=t, tokens=turns[t].tokens.total, cost_usd=turns[t].cost_usd)
                      for t in turn_ids if t in turns))


def _lines(split: dict[str | None, Figures]) -> tuple[UsageLine, ...]:
    return tuple(UsageLine(key=key, tokens=f.tokens.total, cost_usd=f.cost_usd)
                 for key, f in sorted(split.items(), key=lambda item: item[0] or "") if not f.tokens.is_zero())
