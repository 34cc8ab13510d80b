"""``tillerman timeline``: the page for a recorded session, and for a session of 5,000
turns, opened in real headless chromium (``tests.browser``): turn bands and intent
markers are in the DOM, nothing is fetched from the network, and the DOM stays bounded.
A session whose every recorded field carries markup an attacker would write still
draws, shows that markup as text, and runs none of it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.browser import chromium_dom, chromium_evaluate, chromium_screenshot
from tests.hostile import HTML, TERMINAL, hostile_session
from tillerman.controller.cli.main import main
from tillerman.controller.core.intent_requests import proposal_envelopes, transition_envelope
from tillerman.controller.report.fold import fold_facts
from tillerman.controller.report.timeline import MAX_DRAWN, render_html, timeline_data, usage_line
from tillerman.controller.report.usage import UsageReport
from tillerman.ledger import events as ev
from tillerman.ledger.events import Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent, text_digest
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.ledger.usage import Tokens
from tillerman.rules.prices import bundled_table

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ROOT / "fixtures" / "sessions"


def test_recorded_session_page_shows_turns_calls_and_the_intent(tmp_path: Path) -> None:
    page = tmp_path / "timeline.html"
    out = CliRunner().invoke(main, ["timeline", "--config", str(SESSIONS / "replay" / "grants.toml"),
                                    str(SESSIONS), "--html", str(page)])
    assert out.exit_code == 0, out.output
    text = page.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), "the page must load nothing from a network"
    data = embedded_data(text)
    assert data["intents"] and data["turns"] and data["calls"]
    dom = chromium_dom(page)
    assert dom.count('class="mark turn-band') == len(data["turns"])
    for intent in data["intents"]:
        assert f'data-intent="{intent["id"]}"' in dom
    assert dom.count("journey-step") >= sum(len(i["steps"]) for i in data["intents"])
    assert "stall-marker" in dom and "tool-call" in dom
    chromium_screenshot(page, tmp_path / "recorded.png")


def embedded_text(page: str) -> str:
    return re.search(r'id="timeline-data">(.*?)</script>', page, re.S)[1]


def embedded_data(page: str) -> dict:
    return json.loads(embedded_text(page))


def hostile_page(tmp_path: Path, strings: dict[str, str]) -> tuple[Path, dict]:
    recorder = MemoryRecorder()
    recorder.append(hostile_session(strings))
    data = timeline_data(fold_facts(recorder.read()))
    page = tmp_path / "hostile.html"
    page.write_text(render_html(data), encoding="utf-8")
    return page, data


def test_the_embedded_data_holds_no_markup_and_reads_back_as_recorded(tmp_path: Path) -> None:
    page, data = hostile_page(tmp_path, HTML | TERMINAL)
    text = page.read_text(encoding="utf-8")
    assert not set("<>&\u2028\u2029") & set(embedded_text(text)), "the HTML parser would read markup in the data"
    assert embedded_data(text) == json.loads(json.dumps(data))
    recorded = set(strings_in(data))
    for hostile in (HTML | TERMINAL).values():  # every kind of field the page shows carries one
        for field in (f"thread-{hostile}", f"turn-{hostile}", f"bash {hostile}", f"queued-{hostile}",
                      f"turn x made no progress for 600s {hostile}", f"in-waiting-{hostile}", f"class-{hostile}",
                      f"owner:{hostile}", f"reason-{hostile}", f"key-{hostile}", f"goal-{hostile}",
                      f"trigger-{hostile}"):
            assert field in recorded, field


def strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


@pytest.mark.parametrize("name", [*HTML, "all"])
def test_the_page_draws_every_hostile_string_as_text_and_runs_none(tmp_path: Path, name: str) -> None:
    # One string at a time too: a later "-->" would undo what an earlier "<!--<script>" did.
    page, data = hostile_page(tmp_path, HTML | TERMINAL if name == "all" else {name: HTML[name]})
    drawn = chromium_evaluate(page, """({
        pwned: typeof window.pwned, scripts: document.scripts.length,
        lanes: [...document.querySelectorAll('.lane-label')].map(e => e.textContent),
        turns: document.querySelectorAll('.turn-band').length,
        calls: [...document.querySelectorAll('.tool-call')].map(e => e.title),
        intents: document.querySelectorAll('.intent-marker').length,
        goals: [...document.querySelectorAll('.goal-mark')].map(e => [e.dataset.goal, e.title]),
        bands: [...document.querySelectorAll('.turn-band')].map(e => e.title),
        detail: (document.querySelector('.tool-call').click(), document.getElementById('detail').textContent),
    })""", wait_for=".intent-marker")
    assert drawn["pwned"] == "undefined" and drawn["scripts"] == 2, "a script ran from the recorded data"
    assert drawn["lanes"] == data["threads"]
    assert drawn["turns"] == len(data["turns"]) and drawn["intents"] == len(data["intents"])
    assert sorted(drawn["calls"]) == sorted(f"{c['tool']} (critical): {c['status']}" for c in data["calls"])
    assert sorted(drawn["goals"]) == sorted([g["status"], f"goal {g['status']}"] for g in data["goals"])
    assert sorted(drawn["bands"]) == sorted(f"turn {t['id']} ({t['status']}; started by {t['trigger']}; no usage recorded)"
                                            for t in data["turns"])  # no usage in the session: none said, not 0
    assert json.loads(drawn["detail"])["tool"] in {c["tool"] for c in data["calls"]}


def test_thread_filter_and_unknown_thread(tmp_path: Path) -> None:
    page = tmp_path / "t.html"
    out = CliRunner().invoke(main, ["timeline", str(SESSIONS), "--thread", "no-such-thread", "--html", str(page)])
    assert out.exit_code == 2 and "is not in the ledger" in out.output


def big_session(turns: int) -> list[Envelope]:
    """``turns`` turns of one thread, each with a tool call, and an intent every 50 turns."""
    out: list[Envelope] = []
    for n in range(turns):
        at, turn = 10.0 * n, f"turn-{n}"
        out += [Envelope(event_id=f"s{n}", source="appserver", at=at, event=ev.TurnStarted(thread_id="T", turn_id=turn)),
                Envelope(event_id=f"i{n}", source="appserver", at=at + 1, event=ev.ItemStarted(
                    thread_id="T", turn_id=turn, item_id=f"c{n}", item_type="commandExecution", critical=n % 7 == 0)),
                Envelope(event_id=f"j{n}", source="appserver", at=at + 3, event=ev.ItemCompleted(
                    thread_id="T", turn_id=turn, item_id=f"c{n}", item_type="commandExecution")),
                Envelope(event_id=f"e{n}", source="appserver", at=at + 8, event=ev.TurnCompleted(
                    thread_id="T", turn_id=turn))]
        if n % 50 == 0:
            intent = Intent(id=f"in-{n:020d}", thread_id="T", mode="steer", text="x", text_digest=text_digest("x"),
                            created_at=at + 2, ack_deadline=at + 60, expires_at=at + 600, expected_turn_id=turn)
            out += proposal_envelopes(intent, Projection())
            out.append(transition_envelope(intent, State.PROPOSED, State.DISPATCH_UNKNOWN, "dispatching", {}, at + 2))
    return out


def test_a_session_of_5000_turns_keeps_the_dom_bounded(tmp_path: Path) -> None:
    recorder = MemoryRecorder()
    recorder.append(big_session(5000))
    data = timeline_data(fold_facts(recorder.read()))
    assert len(data["turns"]) == 5000 and len(data["calls"]) == 5000
    page = tmp_path / "big.html"
    page.write_text(render_html(data))
    dom = chromium_dom(page)
    elements = len(re.findall(r"<[a-zA-Z]", dom))
    drawn = int(re.search(r'id="status" data-drawn="(\d+)"', dom)[1])
    assert 0 < drawn <= MAX_DRAWN
    assert elements <= 5000, f"{elements} elements in the DOM for 5,000 turns"
    assert 0 < dom.count("turn-band") < 5000  # a window, not the whole session
    assert "data-intent=" in dom


def test_clicking_an_intent_marker_shows_its_journey_with_evidence(tmp_path: Path) -> None:
    recorder = MemoryRecorder()
    recorder.append(big_session(60))
    page = tmp_path / "small.html"
    page.write_text(render_html(timeline_data(fold_facts(recorder.read()))))
    shown = chromium_evaluate(page, "(document.querySelector('.intent-marker').click(),"
                                    " document.getElementById('detail').textContent)",
                              wait_for=".intent-marker")
    journey = json.loads(shown)
    assert journey["id"] == "in-00000000000000000000"
    assert [(s["kind"], s["state"], s["reason"]) for s in journey["steps"]] == [
        ("proposed", "proposed", "owner:unknown"), ("transition", "dispatch_unknown", "dispatching")]


def test_one_script_inlined_standalone_and_linked_by_the_dashboard() -> None:
    """``timeline.js`` and ``timeline.css`` are the page's only script and style: inlined
    in the standalone page (it opens from file://), linked where a CSP forbids inline
    script; no inline style attribute either way."""
    from tillerman.controller.report.timeline import ASSETS, SCRIPT, STYLE

    data = timeline_data(fold_facts(iter(())))
    standalone, linked = render_html(data), render_html(data, assets_url="/assets/")
    assert (ASSETS / SCRIPT).read_text() in standalone and (ASSETS / STYLE).read_text() in standalone
    assert '<script src="/assets/timeline.js"></script>' in linked
    assert '<link rel="stylesheet" href="/assets/timeline.css">' in linked
    assert "<style" not in linked and re.findall(r"<script>", linked) == []
    assert " style=" not in standalone and " style=" not in linked


def spending_session() -> list[Envelope]:
    """Two turns of thread T: one spent on a priced model, the other on one with no
    known price; a response named for no turn; and thread U, another's spending."""
    def env(key: str, event: ev.Event, at: float) -> Envelope:
        return Envelope(event_id=key, source="appserver", at=at, event=event)

    def used(thread: str, turn: str | None, model: str, tokens: int) -> ev.Usage:
        return ev.Usage(thread_id=thread, turn_id=turn, source_kind="codex_rollout", model=model,
                        tokens=Tokens(input=tokens, output=tokens // 10))

    return [env("a", ev.TurnStarted(thread_id="T", turn_id="priced"), 1_700_000_000.0),
            env("b", used("T", "priced", "gpt-5", 12_000), 1_700_000_001.0),
            env("c", used("T", "priced", "gpt-5", 3_000), 1_700_000_002.0),
            env("d", ev.TurnCompleted(thread_id="T", turn_id="priced"), 1_700_000_003.0),
            env("e", ev.TurnStarted(thread_id="T", turn_id="unpriced"), 1_700_000_004.0),
            env("f", used("T", "unpriced", "no-such-model", 500), 1_700_000_005.0),
            env("g", used("T", None, "gpt-5", 700), 1_700_000_006.0),
            env("h", ev.TurnStarted(thread_id="U", turn_id="other"), 1_700_000_007.0),
            env("i", used("U", "other", "gpt-5", 9_000), 1_700_000_008.0)]


def usage_report(by: str, entries) -> dict:
    report = UsageReport(bundled_table(), by=by, tz=dt.timezone.utc)
    report.add_all(e.envelope for e in entries)
    return report.as_json()


def test_each_turn_band_and_the_header_show_what_the_usage_report_says(tmp_path: Path) -> None:
    recorder = MemoryRecorder()
    recorder.append(spending_session())
    data = timeline_data(fold_facts(recorder.read()), thread_id="T")
    by_turn = {row["turn"]: row for row in usage_report("turn", recorder.read())["rows"] if row["session"] == "T"}
    turns = {t["id"]: t for t in data["turns"]}
    assert turns["priced"]["tokens"] == by_turn["priced"]["total"] == 16_500
    assert turns["priced"]["cost"] == pytest.approx(by_turn["priced"]["cost_usd"]) and turns["priced"]["cost"] > 0
    assert turns["unpriced"]["tokens"] == 550 and turns["unpriced"]["cost"] is None  # no price: no cost, not 0
    session = next(r for r in usage_report("session", recorder.read())["rows"] if r["session"] == "T")
    assert data["usage"]["tokens"] == session["total"] == 16_500 + 550 + 770  # U's not counted
    assert data["usage"]["cost"] is None and data["usage"]["context_use"] == {"T": session["context_use"]}
    page = tmp_path / "t.html"
    page.write_text(render_html(data))
    header = re.search(r'<span id="usage">([^<]*)</span>', page.read_text())[1]
    assert header.startswith("17,820 tokens, unknown price") and "$0" not in header
    drawn = chromium_evaluate(page, "JSON.stringify([...document.querySelectorAll('.turn-usage')]"
                                    ".map(e => e.textContent))", wait_for=".turn-usage")
    assert json.loads(drawn) == [f"16,500 tok, ${by_turn['priced']['cost_usd']:.2f}", "550 tok, unknown price"]


def test_a_priced_threads_header_shows_its_cost_and_context_use() -> None:
    recorder = MemoryRecorder()
    recorder.append(spending_session())
    data = timeline_data(fold_facts(recorder.read()), thread_id="U")
    session = next(r for r in usage_report("session", recorder.read())["rows"] if r["session"] == "U")
    assert usage_line(data["usage"]) == (f"9,900 tokens, ${session['cost_usd']:.2f}; "
                                         f"context {session['context_use']:.0%} full")


def test_the_axis_ticks_and_a_turns_times_have_no_fraction_of_a_second(tmp_path: Path) -> None:
    recorder = MemoryRecorder()
    recorder.append(big_session(60))
    page = tmp_path / "small.html"
    page.write_text(render_html(timeline_data(fold_facts(recorder.read()))))
    shown = json.loads(chromium_evaluate(page, """JSON.stringify({
        ticks: [...document.querySelectorAll('#axis span')].map(e => e.textContent),
        turn: (document.querySelector('.turn-band').click(), JSON.parse(document.getElementById('detail').textContent)),
    })""", wait_for=".turn-band"))
    whole_second = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ")
    assert len(shown["ticks"]) == 5
    for time in [*shown["ticks"], shown["turn"]["started"], shown["turn"]["ended"]]:
        assert whole_second.fullmatch(time), time
    assert (shown["turn"]["started"], shown["turn"]["ended"]) == ("1970-01-01 00:00:00Z", "1970-01-01 00:00:08Z")


def test_a_turn_with_no_usage_recorded_has_no_figures_not_zeros() -> None:
    recorder = MemoryRecorder()
    recorder.append([*spending_session(), Envelope(event_id="j", source="appserver", at=1_700_000_009.0,
                                                   event=ev.TurnStarted(thread_id="V", turn_id="idle"))])
    idle = timeline_data(fold_facts(recorder.read()), thread_id="V")
    assert [(t["id"], t["tokens"], t["cost"]) for t in idle["turns"]] == [("idle", None, None)]
    assert idle["usage"]["tokens"] is None and usage_line(idle["usage"]) == "no usage recorded"
    spent = timeline_data(fold_facts(recorder.read()))
    assert spent["usage"]["tokens"] == 16_500 + 550 + 770 + 9_900  # the idle turn adds nothing, and is no 0


def test_with_since_the_header_sums_the_turns_drawn() -> None:
    recorder = MemoryRecorder()
    recorder.append(spending_session())
    data = timeline_data(fold_facts(recorder.read()), thread_id="T", since=1_700_000_004.0)
    assert [t["id"] for t in data["turns"]] == ["unpriced"]
    assert data["usage"]["tokens"] == 550 and data["usage"]["cost"] is None  # not the earlier turn's 16,500


def spending_ledger(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.sqlite3"
    with SQLiteRecorder(path) as recorder:
        recorder.append(spending_session())
    return path


def test_the_timeline_prices_with_the_table_in_force_as_usage_does(tmp_path: Path) -> None:
    ledger, config, page = spending_ledger(tmp_path), tmp_path / "config.toml", tmp_path / "t.html"
    config.write_text('[prices."gpt-5"]\ninput = 100.0\noutput = 1000.0\n')
    out = CliRunner().invoke(main, ["timeline", "--ledger", str(ledger), "--config", str(config), "--thread", "U",
                                    "--html", str(page)])
    assert out.exit_code == 0, out.output
    usage = CliRunner().invoke(main, ["usage", "--ledger", str(ledger), "--config", str(config), "--by", "session",
                                      "--json"])
    assert usage.exit_code == 0, usage.output
    session = next(r for r in json.loads(usage.output)["rows"] if r["session"] == "U")
    cost = embedded_data(page.read_text())["usage"]["cost"]
    assert cost == pytest.approx(session["cost_usd"]) == pytest.approx((9_000 * 100.0 + 900 * 1000.0) / 1e6)
