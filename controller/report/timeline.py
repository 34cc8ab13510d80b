"""``tillerman timeline``: a session drawn as one self-contained HTML page.

``timeline_data`` turns the folded facts (``tillerman.controller.report.fold``) into
plain JSON: threads, turns (with what started each), tool calls, approval waits, queue
entries, stalls, the changes of each thread's Codex goal and each intent's journey with
the evidence of every step. ``render_html`` embeds that JSON in
one page with its CSS and script inline: no network asset, so it opens from
``file://``. The page draws only what lies in the visible time window and at most
``MAX_DRAWN`` marks at a time (the rest is drawn when the window moves there), so a
session of thousands of turns keeps a small DOM. Both functions are pure.
"""

from __future__ import annotations

import html
import json

from tillerman.controller.report.fold import STALL_FINDING, Facts
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

    data: dict = {"threads": threads, "end": end, "max_drawn": MAX_DRAWN, "turns": [], "calls": [], "waits": [],
                  "stalls": [], "goals": [], "intents": []}
    for t in turns:
        s, e = span(t.started_at, t.ended_at)
        if s is not None:
            trigger, inferred = facts.trigger(t)
            data["turns"].append({"lane": lane[t.thread_id], "id": t.turn_id, "s": s, "e": e,
                                  "status": t.status or "open", "trigger": trigger or "not known",
                                  "inferred": inferred})
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


#: What the HTML parser could read as markup inside a script element (``</script``,
#: ``<!--``, ``-->``, an entity): written as JSON escapes, which decode to the same text.
_MARKUP_IN_SCRIPT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def script_json(data: dict) -> str:
    """``data`` as JSON that a ``<script>`` element holds as plain text, whatever strings
    the recorded session carries: no ``<``, ``>`` or ``&`` is left for the HTML parser
    (``<!--<script`` would switch it into its double-escaped state and the page would draw
    nothing), and every non-ASCII character, U+2028 and U+2029 too, is a ``\\u`` escape."""
    return json.dumps(data, sort_keys=True, ensure_ascii=True).translate(_MARKUP_IN_SCRIPT)


def render_html(data: dict) -> str:
    title = html.escape(f"tillerman timeline: {len(data['threads'])} threads, {len(data['turns'])} turns,"
                        f" {len(data['intents'])} intents")
    return _PAGE.replace("__TITLE__", title).replace("__DATA__", script_json(data))


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
body { font: 13px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #fafbfc; }
header { padding: 8px 12px; background: #1d2330; color: #fff; display: flex; gap: 12px; align-items: center; }
header h1 { font-size: 15px; margin: 0; font-weight: 600; }
header button { font: inherit; padding: 2px 8px; }
#status { margin-left: auto; opacity: .85; }
#legend { padding: 4px 12px; display: flex; gap: 14px; flex-wrap: wrap; border-bottom: 1px solid #dde; }
#legend span::before { content: ""; display: inline-block; width: 12px; height: 10px; margin-right: 4px;
  vertical-align: middle; background: var(--c); border-radius: 2px; }
#chart { position: relative; overflow: hidden; margin: 0 12px; }
.lane { position: absolute; left: 0; right: 0; height: 86px; border-bottom: 1px dashed #ccd; }
.lane-label { position: absolute; left: 2px; top: 2px; font-size: 11px; color: #556; z-index: 3; }
.mark { position: absolute; box-sizing: border-box; cursor: pointer; }
.turn-band { height: 26px; top: 16px; background: #cfe3ff; border: 1px solid #6d9ee8; border-radius: 3px; }
.turn-band.interrupted { background: #ffe0c2; border-color: #e08a3c; }
.turn-band.failed { background: #ffd0d0; border-color: #d04848; }
.turn-band.open { background: repeating-linear-gradient(45deg, #cfe3ff 0 6px, #e8f1ff 6px 12px); }
.tool-call { height: 8px; top: 46px; min-width: 3px; background: #7a8699; border-radius: 2px; }
.tool-call.critical { background: #c22; outline: 2px solid #f7b; }
.approval-wait { height: 6px; top: 57px; background: #e6b800; }
.queue-entry { height: 6px; top: 57px; background: #9b59b6; }
.stall-marker { top: 12px; width: 0; height: 34px; border-left: 3px dotted #d04848; }
.goal-mark { top: 2px; width: 10px; height: 10px; margin-left: -5px; background: #0a7d8c; transform: rotate(45deg); }
.goal-mark.halted { background: #d04848; }
.intent-marker { top: 66px; width: 12px; height: 12px; margin-left: -6px; border-radius: 50%;
  background: #2e8b57; border: 2px solid #fff; box-shadow: 0 0 0 1px #2e8b57; z-index: 2; }
.intent-marker.rejected, .intent-marker.expired, .intent-marker.effect_failed { background: #b33; box-shadow: 0 0 0 1px #b33; }
.intent-marker.proposed, .intent-marker.dispatch_unknown, .intent-marker.queued { background: #e0a000; }
.journey-line { top: 71px; height: 2px; background: #2e8b57; opacity: .5; }
.journey-step { top: 68px; width: 6px; height: 6px; margin-left: -3px; background: #1d2330; border-radius: 1px; }
#axis { position: relative; overflow: hidden; white-space: nowrap; height: 18px; margin: 0 12px; font-size: 11px; color: #556; border-bottom: 1px solid #99a; }
#axis span { position: absolute; transform: translateX(-50%); }
#axis span:first-child { transform: none; } #axis span:last-child { transform: translateX(-100%); }
#detail { margin: 10px 12px; padding: 8px; background: #fff; border: 1px solid #dde; min-height: 40px;
  white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px; }
</style></head>
<body>
<header><h1>__TITLE__</h1>
<button id="earlier" title="Move the window earlier">&larr;</button>
<button id="zoom-in" title="Zoom in">+</button><button id="zoom-out" title="Zoom out">&minus;</button>
<button id="later" title="Move the window later">&rarr;</button><button id="all">whole session</button>
<span id="status"></span></header>
<div id="legend"><span style="--c:#cfe3ff">turn</span><span style="--c:#ffe0c2">interrupted turn</span>
<span style="--c:#7a8699">tool call</span><span style="--c:#c22">critical tool call</span>
<span style="--c:#e6b800">approval wait</span><span style="--c:#9b59b6">queue entry</span>
<span style="--c:#d04848">stall</span><span style="--c:#0a7d8c">goal change</span>
<span style="--c:#2e8b57">intent (journey)</span></div>
<div id="axis"></div><div id="chart"></div>
<div id="detail">Click a mark for its evidence.</div>
<script type="application/json" id="timeline-data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("timeline-data").textContent);
const chart = document.getElementById("chart"), axis = document.getElementById("axis");
const detail = document.getElementById("detail"), statusLine = document.getElementById("status");
const LANE = 86;
const times = [];
for (const t of D.turns) { times.push(t.s, t.e); }
for (const i of D.intents) for (const s of i.steps) times.push(s.at);
for (const c of D.calls) times.push(c.s);
for (const g of D.goals) times.push(g.at);
const clean = times.filter(x => typeof x === "number");
const t0 = clean.length ? Math.min(...clean.slice(0, 200000)) : 0;
const t1 = clean.length ? Math.max(...clean.slice(0, 200000)) : 1;
// Every mark with its time range, sorted by start, so a window is found by bisection.
const marks = [];
for (const t of D.turns) marks.push({s: t.s, e: t.e, kind: "turn", d: t});
for (const c of D.calls) marks.push({s: c.s, e: c.e, kind: "call", d: c});
for (const w of D.waits) marks.push({s: w.s, e: w.e, kind: w.kind, d: w});
for (const s of D.stalls) marks.push({s: s.at, e: s.at, kind: "stall", d: s});
for (const g of D.goals) marks.push({s: g.at, e: g.at, kind: "goal", d: g});
for (const i of D.intents) {
  const ats = i.steps.map(s => s.at);
  marks.push({s: Math.min(...ats), e: Math.max(...ats), kind: "intent", d: i});
}
marks.sort((a, b) => a.s - b.s);
const longest = marks.reduce((m, x) => Math.max(m, (x.e ?? x.s) - x.s), 0);
function firstFrom(time) {  // index of the first mark starting at or after time
  let lo = 0, hi = marks.length;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (marks[mid].s < time) lo = mid + 1; else hi = mid; }
  return lo;
}
let view = initialView();
function initialView() {
  if (marks.length <= D.max_drawn / 2) return [t0, t1 + (t1 - t0) * 0.02 + 1e-3];
  const last = marks[Math.min(marks.length - 1, Math.floor(D.max_drawn / 8))];
  return [t0, Math.max(last.s, t0 + 1)];
}
function el(cls, left, width, lane, title, onclick) {
  const div = document.createElement("div");
  div.className = "mark " + cls;
  div.style.left = left + "px";
  if (width !== null) div.style.width = Math.max(width, 2) + "px";
  div.style.top = "calc(" + (lane * LANE) + "px + " + (getComputedStyleTop(cls)) + ")";
  div.title = title;
  div.addEventListener("click", onclick);
  return div;
}
const tops = {"turn-band": "16px", "tool-call": "46px", "approval-wait": "57px", "queue-entry": "57px",
              "stall-marker": "12px", "goal-mark": "2px", "intent-marker": "66px", "journey-line": "71px", "journey-step": "68px"};
function getComputedStyleTop(cls) { return tops[cls.split(" ")[0]] || "0px"; }
function show(obj) { detail.textContent = JSON.stringify(obj, null, 2); }
function fmt(t) { return new Date(t * 1000).toISOString().replace("T", " ").replace(/\\.\\d+Z$/, "Z"); }
function draw() {
  const [a, b] = view, width = chart.clientWidth || 1000, scale = width / (b - a);
  const x = t => (t - a) * scale;
  const frag = document.createDocumentFragment();
  chart.style.height = Math.max(1, D.threads.length) * LANE + "px";
  D.threads.forEach((name, i) => {
    const lane = document.createElement("div");
    lane.className = "lane"; lane.style.top = i * LANE + "px";
    const label = document.createElement("div");
    label.className = "lane-label"; label.textContent = name;
    lane.appendChild(label); frag.appendChild(lane);
  });
  let drawn = 0, skipped = 0;
  for (let k = firstFrom(a - longest); k < marks.length && marks[k].s <= b; k++) {
    const m = marks[k], end = m.e ?? m.s;
    if (end < a) continue;
    if (drawn >= D.max_drawn) { skipped++; continue; }
    const d = m.d, left = x(Math.max(m.s, a)), w = x(Math.min(end, b)) - left;
    if (m.kind === "turn") {
      const by = d.trigger + (d.inferred ? ", inferred" : "");
      frag.appendChild(el("turn-band " + d.status, left, w, d.lane,
        "turn " + d.id + " (" + d.status + "; started by " + by + ")",
        () => show({turn: d.id, status: d.status, trigger: d.trigger, inferred: d.inferred, started: fmt(d.s),
                    ended: fmt(d.e)})));
      drawn++;
    } else if (m.kind === "call") {
      frag.appendChild(el("tool-call" + (d.critical ? " critical" : ""), left, w, d.lane,
        d.tool + (d.critical ? " (critical)" : "") + ": " + d.status, () => show(d)));
      drawn++;
    } else if (m.kind === "approval" || m.kind === "queue") {
      frag.appendChild(el(m.kind === "approval" ? "approval-wait" : "queue-entry", left, w, d.lane,
        m.kind + " " + d.key + (d.detail ? ": " + d.detail : ""), () => show(d)));
      drawn++;
    } else if (m.kind === "stall") {
      frag.appendChild(el("stall-marker", left, null, d.lane, d.finding, () => show(d)));
      drawn++;
    } else if (m.kind === "goal") {
      const mark = el("goal-mark" + (d.halted ? " halted" : ""), left, null, d.lane, "goal " + d.status + (d.token_budget === null ? "" :
        " (" + d.tokens_used + " of " + d.token_budget + " tokens)"), () => show(d));
      mark.dataset.goal = d.status;
      frag.appendChild(mark);
      drawn++;
    } else {
      frag.appendChild(el("journey-line", left, w, d.lane, "intent " + d.id, () => show(d)));
      for (const step of d.steps) {
        if (step.at < a || step.at > b) continue;
        frag.appendChild(el("journey-step", x(step.at), null, d.lane,
          step.kind + ": " + step.state + " (" + step.reason + ")", () => show({intent: d.id, step})));
        drawn++;
      }
      const marker = el("intent-marker " + d.state, x(Math.max(d.steps[0].at, a)), null, d.lane,
        d.mode + " intent " + d.id + " [" + d.task_class + "]: " + d.state, () => show(d));
      marker.dataset.intent = d.id;
      frag.appendChild(marker);
      drawn += 2;
    }
  }
  chart.replaceChildren(frag);
  const ticks = document.createDocumentFragment();
  for (let i = 0; i <= 4; i++) {
    const span = document.createElement("span");
    span.style.left = (i * 25) + "%"; span.textContent = fmt(a + (b - a) * i / 4);
    ticks.appendChild(span);
  }
  axis.replaceChildren(ticks);
  statusLine.textContent = drawn + " marks drawn" + (skipped ? "; " + skipped +
    " more items in this window: zoom in to draw them" : "") + " (" + marks.length + " items in all)";
  statusLine.dataset.drawn = drawn;
}
function move(f) { const w = view[1] - view[0]; view = [view[0] + w * f, view[1] + w * f]; draw(); }
function zoom(f) { const c = (view[0] + view[1]) / 2, w = (view[1] - view[0]) * f / 2; view = [c - w, c + w]; draw(); }
document.getElementById("earlier").onclick = () => move(-0.5);
document.getElementById("later").onclick = () => move(0.5);
document.getElementById("zoom-in").onclick = () => zoom(0.5);
document.getElementById("zoom-out").onclick = () => zoom(2);
document.getElementById("all").onclick = () => { view = [t0, t1 + 1e-3]; draw(); };
chart.addEventListener("wheel", ev => { ev.preventDefault(); ev.shiftKey ? move(ev.deltaY > 0 ? 0.2 : -0.2)
  : zoom(ev.deltaY > 0 ? 1.25 : 0.8); }, {passive: false});
window.addEventListener("resize", draw);
draw();
</script></body></html>
"""
