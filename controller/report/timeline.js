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
// What a turn spent: tokens null, no usage recorded; a cost null has no known price. Each
// is said so, never shown as 0 tok or $0.
function spent(d) {
  if (d.tokens === null) return "no usage recorded";
  return d.tokens.toLocaleString("en-US") + " tok, " + (d.cost === null ? "unknown price" : "$" + d.cost.toFixed(2));
}
function fmt(t) { return new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z"); }
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
      const band = el("turn-band " + d.status, left, w, d.lane,
        "turn " + d.id + " (" + d.status + "; started by " + by + "; " + spent(d) + ")",
        () => show({turn: d.id, status: d.status, trigger: d.trigger, inferred: d.inferred, started: fmt(d.s),
                    ended: fmt(d.e), tokens: d.tokens === null ? "no usage recorded" : d.tokens,
                    cost: d.tokens === null ? "no usage recorded" : d.cost === null ? "unknown price" : d.cost}));
      const figures = document.createElement("span");
      figures.className = "turn-usage"; figures.textContent = spent(d);
      band.appendChild(figures);
      frag.appendChild(band);
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
