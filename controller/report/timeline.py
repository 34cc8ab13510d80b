"""``tillerman timeline``: a session drawn as one self-contained HTML page.

``timeline_data`` turns the folded facts (``tillerman.controller.report.fold``) into
plain JSON: threads, turns (with what started each), tool calls, approval waits, queue
entries, stalls, the changes of each thread's Codex goal, each intent's journey with
the evidence of every step, and what each turn and the shown threads spent (the usage
report's figures in ``Facts.usage``: each response priced once, as ``tillerman usage``;
a cost None where a response has no known price, tokens and cost None where no usage
was recorded). ``render_html`` embeds that JSON in
one page with its CSS and script (``timeline.css``, ``timeline.js`` beside this module)
inline: no network asset, so it opens from ``file://``; the dashboard links the same two
files instead. The page draws only what lies in the visible time window and at most
``MAX_DRAWN`` marks at a time (the rest is drawn when the window moves there), so a
session of thousands of turns keeps a small DOM. Both functions are pure.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from tillerman.controller.report.fold import STALL_FINDING, Facts
from tillerman.controller.report.usage import Figures
from tillerman.ledger.snapshot import GOAL_HALTED

#: The most marks (turn bands, calls, waits, intent steps) the page draws at once.
MAX_DRAWN = 4000


def timeline_data(facts: Facts, *, thread_id: str | None = None, since: float | None = None) -> dict:
    def wanted(thread: str | None, at: float | None) -> bool:
        return (thread_id is None or thread == thread_id) and (since is None or at is None or at >= since)

    turns = sorted((t for t in facts.turns.values() if wanted(t.thread_id, t.ended_at or t.started_at)),
                   key=lambda t: (t.started_at or t.ended_at or 0, t.seq))
    threads = sorted({t.thread_id for t in turns} | {
        v.intent.thread_id for v in facts.projection.intents.values() if wanted(v.intent.thread_id, None)})
    lane = {thread: i for i, thread in enumerate(threads)}
    end = facts.last_at

    def span(start: float | None, stop: float | None) -> tuple[float | None, float | None]:
        start = start if start is not None else stop
        return start, stop if stop is not None else end

    spent = _spending(facts, set(threads))
    data: dict = {"threads": threads, "end": end, "max_drawn": MAX_DRAWN, "turns": [], "calls": [], "waits": [],
                  "stalls": [], "goals": [], "intents": []}
    drawn: set[tuple[str | None, str | None]] = set()
    for t in turns:
        s, e = span(t.started_at, t.ended_at)
        if s is not None:
            trigger, inferred = facts.trigger(t)
            drawn.add((t.thread_id, t.turn_id))
            data["turns"].append({"lane": lane[t.thread_id], "id": t.turn_id, "s": s, "e": e,
                                  "status": t.status or "open", "trigger": trigger or "not known",
                                  "inferred": inferred, **_figures(spent.get((t.thread_id, t.turn_id)))})
    # With ``since``, the header is what the drawn turns spent: a response named for no
    # turn has no time here to place it before or after ``since``.
    data["usage"] = _usage(facts, threads, spent if since is None else {k: spent[k] for k in drawn & spent.keys()})
    for c in sorted(facts.calls.values(), key=lambda c: c.seq):
        s, e = span(c.started_at, c.ended_at)
        if c.thread_id in lane and s is not None and wanted(c.thread_id, s):
            data["calls"].append({"lane": lane[c.thread_id], "id": c.item_id, "s": s, "e": e, "tool": c.tool or c.item_type,
                                  "critical": c.critical, "status": c.status or "running", "exit": c.exit_code})
    for w in facts.spans.values():
        s, e = span(w.start, w.end)
        if w.thread_id in lane and s is not None and wanted(w.thread_id, s):
            data["waits"].append({"lane": lane[w.thread_id], "kind": w.kind, "key": w.key, "s": s, "e": e,
                                  "detail": w.detail})
    for r in facts.reports:
        if not r.shadow and r.thread_id in lane and r.at is not None and STALL_FINDING.match(r.finding) \
                and wanted(r.thread_id, r.at):
            data["stalls"].append({"lane": lane[r.thread_id], "at": r.at, "finding": r.finding, "seq": r.seq})
    for c in facts.goal_changes:
        if c.thread_id in lane and c.at is not None and wanted(c.thread_id, c.at):
            data["goals"].append({"lane": lane[c.thread_id], "at": c.at, "status": c.status, "by": c.by,
                                  "token_budget": c.token_budget, "tokens_used": c.tokens_used, "turn": c.turn_id,
                                  "seq": c.seq, "halted": c.status in GOAL_HALTED})
    for view in sorted(facts.projection.intents.values(), key=lambda v: v.intent.created_at):
        intent = view.intent
        if intent.thread_id not in lane or not wanted(intent.thread_id, intent.created_at):
            continue
        data["intents"].append({
            "lane": lane[intent.thread_id], "id": intent.id, "mode": intent.mode, "task_class": intent.task_label,
            "state": str(view.state), "producer": intent.producer, "turn": intent.expected_turn_id,
            "steps": [{"at": h.at if h.at is not None else intent.created_at, "seq": h.seq, "kind": h.kind,
                       "state": str(h.state), "reason": h.reason, "evidence": h.evidence} for h in view.history],
        })
    return data


def _spending(facts: Facts, threads: set[str]) -> dict[tuple[str | None, str | None], Figures]:
    """The figures of each turn of ``threads`` (a turn two sources name differently is
    one), and under ``(thread, None)`` what was spent in no turn named."""
    out: dict[tuple[str | None, str | None], Figures] = {}
    for key, rows in facts.usage_of_turns().items():
        if key[0] in threads:
            for row in rows:
                out.setdefault(key, Figures()).merge(row)
    return out


def _figures(figures: Figures | None) -> dict:
    """``tokens`` and ``cost``; both None: no usage recorded, counted apart and never as 0
    (as ``tillerman report`` counts it); a cost None alone: a response in it has no known
    price. The page says which, never 0."""
    if figures is None:
        return {"tokens": None, "cost": None}
    return {"tokens": figures.tokens.total, "cost": figures.cost_usd}


def _usage(facts: Facts, threads: list[str], spent: dict[tuple[str | None, str | None], Figures]) -> dict:
    """What ``spent`` sums to (no figures when it is empty), and each shown thread's context
    use at its last response (as ``tillerman usage --by session`` says it)."""
    total = Figures() if spent else None
    for figures in spent.values():
        total.merge(figures)
    return {**_figures(total), "context_use": {t: facts.usage.context(t)["context_use"] for t in threads}}


def usage_line(usage: dict) -> str:
    """The page's header: what the drawn threads spent, and the context use of one thread."""
    used = list(usage["context_use"].values())
    context = f"; context {used[0]:.0%} full" if len(used) == 1 and used[0] is not None else ""
    if usage["tokens"] is None:
        return "no usage recorded" + context
    cost = "unknown price" if usage["cost"] is None else f"${usage['cost']:.2f}"
    return f"{usage['tokens']:,} tokens, {cost}{context}"


#: What the HTML parser could read as markup inside a script element (``</script``,
#: ``<!--``, ``-->``, an entity): written as JSON escapes, which decode to the same text.
_MARKUP_IN_SCRIPT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def script_json(data: dict) -> str:
    """``data`` as JSON that a ``<script>`` element holds as plain text, whatever strings
    the recorded session carries: no ``<``, ``>`` or ``&`` is left for the HTML parser
    (``<!--<script`` would switch it into its double-escaped state and the page would draw
    nothing), and every non-ASCII character, U+2028 and U+2029 too, is a ``\\u`` escape."""
    return json.dumps(data, sort_keys=True, ensure_ascii=True).translate(_MARKUP_IN_SCRIPT)


#: The page's style and script, files beside this module: inlined into the standalone
#: page, linked by the dashboard (whose Content-Security-Policy forbids inline script).
ASSETS = Path(__file__).parent
STYLE, SCRIPT = "timeline.css", "timeline.js"


def render_html(data: dict, *, assets_url: str | None = None) -> str:
    """The page. ``assets_url`` None: self-contained, its style and script inline (it
    opens from ``file://``); else they are linked from ``assets_url`` (a path ending in
    ``/``, where ``STYLE`` and ``SCRIPT`` are served), and the data stays a JSON block,
    which no browser runs."""
    title = html.escape(f"tillerman timeline: {len(data['threads'])} threads, {len(data['turns'])} turns,"
                        f" {len(data['intents'])} intents")
    if assets_url is None:
        style = f"<style>\n{(ASSETS / STYLE).read_text()}</style>"
        script = f"<script>\n{(ASSETS / SCRIPT).read_text()}</script>"
    else:
        style = f'<link rel="stylesheet" href="{html.escape(assets_url + STYLE)}">'
        script = f'<script src="{html.escape(assets_url + SCRIPT)}"></script>'
    return (_PAGE.replace("__TITLE__", title).replace("__USAGE__", html.escape(usage_line(data["usage"])))
            .replace("__STYLE__", style).replace("__SCRIPT__", script)
            .replace("__DATA__", script_json(data)))


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
__STYLE__</head>
<body>
<header><h1>__TITLE__</h1><span id="usage">__USAGE__</span>
<button id="earlier" title="Move the window earlier">&larr;</button>
<button id="zoom-in" title="Zoom in">+</button><button id="zoom-out" title="Zoom out">&minus;</button>
<button id="later" title="Move the window later">&rarr;</button><button id="all">whole session</button>
<span id="status"></span></header>
<div id="legend"><span class="legend-turn">turn</span><span class="legend-interrupted-turn">interrupted turn</span>
<span class="legend-tool-call">tool call</span><span class="legend-critical-tool-call">critical tool call</span>
<span class="legend-approval-wait">approval wait</span><span class="legend-queue-entry">queue entry</span>
<span class="legend-stall">stall</span><span class="legend-goal-change">goal change</span>
<span class="legend-intent">intent (journey)</span></div>
<div id="axis"></div><div id="chart"></div>
<div id="detail">Click a mark for its evidence.</div>
<script type="application/json" id="timeline-data">__DATA__</script>
__SCRIPT__</body></html>
"""
