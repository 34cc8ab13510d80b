"""The supervision account (``tillerman report``): figures from made-up ledgers whose
answers are known, figures on the recorded sessions equal to counts taken straight from
the raw events, the ``task_class`` label, and the ``--db`` file (with the query the
docs show, docs/usage/reports.md).
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from pathlib import Path

import msgspec
import pytest
import sqlite_utils
from click.testing import CliRunner

from fixtures.rule_texts import grant, rule
from tillerman.controller.cli.main import main
from tillerman.controller.cli.report import render_text
from tillerman.controller.core.intent_requests import SOURCE, proposal_envelopes, transition_envelope
from tillerman.controller.replay.parallel import ReplaySettings, replay_files
from tillerman.controller.replay.replayer import collect_files
from tillerman.controller.report.account import account
from tillerman.controller.report.db import account_rows
from tillerman.controller.report.fold import fold_facts
from tillerman.ledger import events as ev
from tillerman.ledger.events import Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent, text_digest
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.ledger.usage import Tokens
from tillerman.rules.config import load_effective
from tillerman.rules.prices import bundled_table

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ROOT / "fixtures" / "sessions"
S = State


def intent(n: int, mode: str = "steer", *, at: float = 100.0, verify: str | None = None, **fields) -> Intent:
    return Intent(id=f"in-{n:020d}", thread_id="T", mode=mode, text=f"do {n}", text_digest=text_digest(f"do {n}"),
                  created_at=at, ack_deadline=at + 60, expires_at=at + 600, expected_turn_id="U",
                  effect_deadline=at + 300 if verify else None, verify=verify, **fields)


def observed(key: str, event: ev.Event, at: float) -> Envelope:
    return Envelope(event_id=key, event=event, source="appserver", at=at)


def journey(i: Intent, *moves: tuple[State, State, str, float]) -> list[Envelope]:
    out = proposal_envelopes(i, Projection())
    out += [transition_envelope(i, a, b, reason, {}, at) for a, b, reason, at in moves]
    return out


def ledger_of(*batches: list[Envelope]) -> MemoryRecorder:
    recorder = MemoryRecorder()
    for batch in batches:
        recorder.append(batch)
    return recorder


def facts_of(*batches: list[Envelope]):
    return fold_facts(ledger_of(*batches).read())


DELIVERED = ((S.PROPOSED, S.DISPATCH_UNKNOWN, "dispatching", 101.0), (S.DISPATCH_UNKNOWN, S.QUEUED, "accepted", 102.0))


def test_precision_and_delays_per_mode_and_task_class() -> None:
    plain = intent(1, task_class="triage")
    checked = intent(2, verify="test -f ok", task_class="triage")
    failed = intent(3, verify="test -f ok", task_class="triage")
    refused = intent(4, mode="queue")
    facts = facts_of(
        journey(plain, *DELIVERED, (S.QUEUED, S.ACKNOWLEDGED, "echo", 104.0)),
        journey(checked, *DELIVERED, (S.QUEUED, S.ACKNOWLEDGED, "echo", 110.0),
                (S.ACKNOWLEDGED, S.EFFECT_VERIFIED, "verify_passed", 115.0)),
        journey(failed, *DELIVERED, (S.QUEUED, S.ACKNOWLEDGED, "echo", 120.0),
                (S.ACKNOWLEDGED, S.EFFECT_FAILED, "verify_failed", 150.0)),
        journey(refused, (S.PROPOSED, S.REJECTED, "no_grant", 100.5)),
    )
    result = account(facts)
    steer = next(g for g in result.groups if g.key == {"mode": "steer", "task_class": "triage"})
    queue = next(g for g in result.groups if g.key == {"mode": "queue", "task_class": "unlabeled"})
    assert (steer.proposed.value, steer.dispatched.value, steer.rejected.value) == (3, 3, 0)
    assert steer.precision_effect.value == 0.5 and "1/2" in steer.precision_effect.how
    assert steer.precision_ack.value == 1.0
    assert (steer.intent_to_ack.p50.value, steer.intent_to_ack.max.value) == (10.0, 20.0)
    assert (steer.ack_to_effect.p50.value, steer.ack_to_effect.max.value) == (5.0, 30.0)
    assert (queue.rejected.value, queue.rejected_by_reason) == (1, {"no_grant": 1})
    # nothing to compute: no value, and the reason instead of a zero
    assert queue.precision_effect.value is None and "no settled dispatched intent" in queue.precision_effect.why
    assert queue.intent_to_ack.p95.value is None and queue.intent_to_ack.p95.why == "no intent was acknowledged"
    by_class = account(facts, by=("task_class",))
    assert sorted((g.key["task_class"], g.proposed.value) for g in by_class.groups) == [
        ("triage", 3), ("unlabeled", 1)]
    assert account(facts, since=100.0, until=101.0).totals.proposed.value == 4
    assert account(facts, since=101.0).totals.proposed.value == 0


def test_duplicates_and_silently_lost_intents_are_counted_and_said_loudly() -> None:
    twice = intent(1)
    lost = intent(2)
    reported = intent(3)
    after_accept = intent(4, mode="queue")
    echo = lambda n, turn, item, at: observed(  # noqa: E731
        f"echo:{n}:{turn}:{item}", ev.UserMessage(thread_id="T", turn_id=turn, digest="d", size=1,
                                                  client_id=f"tillerman-{intent(n).id}", item_id=item), at)
    overdue = Envelope(event_id="report:3", source=SOURCE, at=300.0, event=ev.Report(
        thread_id="T", rule_id="tillerman:delivery", rule_version=1, finding="overdue",
        detail={"intent_id": reported.id}))
    batches = [
        journey(twice, *DELIVERED, (S.QUEUED, S.ACKNOWLEDGED, "echo", 103.0)),
        [echo(1, "U", "m1", 103.0), echo(1, "U", None, 103.0), echo(1, "V", "m2", 130.0)],
        journey(lost, (S.PROPOSED, S.DISPATCH_UNKNOWN, "dispatching", 101.0)),
        journey(reported, (S.PROPOSED, S.DISPATCH_UNKNOWN, "dispatching", 101.0)), [overdue],
        journey(after_accept, *DELIVERED, (S.QUEUED, S.EXPIRED, "lost_after_accept", 200.0)),
        [observed("late", ev.TurnCompleted(thread_id="T", turn_id="V"), 400.0)],
    ]
    result = account(facts_of(*batches))
    d = result.delivery
    assert (d.duplicate_deliveries.value, d.duplicated_intents) == (1, [twice.id])
    assert (d.silently_lost.value, d.lost_intents) == (1, [lost.id])
    assert d.lost_after_accept.value == 1 and not d.ok
    # before the ack deadline passed, the open intents are in flight, not lost
    early = account(facts_of(*batches[:4]))
    assert early.delivery.silently_lost.value == 0
    path = _ledger_file(batches)
    out = CliRunner().invoke(main, ["report", "--ledger", str(path)])
    assert out.exit_code == 0, out.output
    assert "!! 1 DUPLICATE DELIVERIES" in out.output and "1 SILENTLY LOST INTENTS" in out.output
    assert re.search(r"expired: lost_after_accept\s+1", out.output)


def _ledger_file(batches: list[list[Envelope]]) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="tillerman-report-")) / "ledger.sqlite3"
    with SQLiteRecorder(path) as recorder:
        for batch in batches:
            recorder.append(batch)
    return path


def test_cancelled_work_stalls_and_owner_interruptions() -> None:
    stop = intent(1, mode="interrupt")
    nudge = intent(2)
    t = lambda key, event, at: observed(key, event, at)  # noqa: E731
    stall_report = lambda turn, at, seq: Envelope(  # noqa: E731
        event_id=f"report:stall:{turn}:{seq}", source=SOURCE, at=at, event=ev.Report(
            thread_id="T", turn_id=turn, rule_id="stall", rule_version=1,
            finding=f"turn {turn} made no progress for 10m", detail={"action": "report_overdue"}))
    batches = [
        [t("u0", ev.TurnStarted(thread_id="T", turn_id="U"), 0.0),
         t("c0", ev.ItemStarted(thread_id="T", turn_id="U", item_id="cmd", item_type="commandExecution"), 10.0),
         t("c1", ev.ItemStarted(thread_id="T", turn_id="U", item_id="done", item_type="commandExecution"), 12.0),
         t("c2", ev.ItemCompleted(thread_id="T", turn_id="U", item_id="done", item_type="commandExecution"), 13.0)],
        journey(stop, (S.PROPOSED, S.DISPATCH_UNKNOWN, "dispatching", 49.0)),
        [t("u1", ev.TurnCompleted(thread_id="T", turn_id="U", status="interrupted"), 50.0),
         t("c3", ev.ItemCompleted(thread_id="T", turn_id="U", item_id="cmd", item_type="commandExecution",
                                  status="failed"), 51.0)],
        # a stall that recovers after our steer, one that recovers alone, one abandoned, one open
        [t("v0", ev.TurnStarted(thread_id="T", turn_id="V"), 60.0), stall_report("V", 70.0, 1)],
        journey(nudge, (S.PROPOSED, S.DISPATCH_UNKNOWN, "dispatching", 71.0)),
        [t("v1", ev.AgentMessage(thread_id="T", turn_id="V", digest="d", size=1), 72.0),
         t("v2", ev.TurnCompleted(thread_id="T", turn_id="V"), 73.0),
         t("w0", ev.TurnStarted(thread_id="T", turn_id="W"), 80.0), stall_report("W", 90.0, 2),
         t("w1", ev.ItemStarted(thread_id="T", turn_id="W", item_id="r", item_type="commandExecution"), 95.0),
         t("w2", ev.TurnCompleted(thread_id="T", turn_id="W"), 96.0),
         t("x0", ev.TurnStarted(thread_id="T", turn_id="X"), 100.0), stall_report("X", 110.0, 3),
         t("x1", ev.TurnCompleted(thread_id="T", turn_id="X", status="failed"), 120.0),
         t("y0", ev.TurnStarted(thread_id="T", turn_id="Y"), 130.0), stall_report("Y", 140.0, 4)],
        [Envelope(event_id="esc", source=SOURCE, at=141.0, event=ev.DecisionRecorded(
            thread_id="T", intent_id=nudge.id, action="escalate", reason="no_grant"))],
    ]
    result = account(facts_of(*batches))
    c = result.cancelled_work
    assert (c.interrupted_turns.value, c.interrupted_by_intent.value, c.turn_seconds.value) == (1, 1, 50.0)
    assert (c.commands_terminated.value, c.command_seconds.value) == (1, 40.0)  # "cmd" ran 10 s..50 s
    s = result.stalls
    assert [x.ended for x in s.items] == ["recovered_after_intervention", "recovered_alone", "abandoned", "unresolved"]
    assert s.items[0].by_intent == nudge.id and s.detected.value == 4
    o = result.owner_interruptions
    assert (o.escalations.value, o.reports.value, o.reports_by_rule) == (1, 4, {"stall": 4})


def test_reviewer_calls_and_cost_zero_is_a_figure() -> None:
    assert account(facts_of([])).reviewer.calls.value == 0
    assert account(facts_of([])).reviewer.cost_usd.value == 0
    review = lambda n, cost: [  # noqa: E731
        Envelope(event_id=f"p{n}", source=SOURCE, at=10.0 + n, event=ev.ReviewPending(
            thread_id="T", checkpoint_id=f"cp{n}", checkpoint="before_dispatch", reviewer="r")),
        Envelope(event_id=f"c{n}", source=SOURCE, at=11.0 + n, event=ev.ReviewCommitted(
            thread_id="T", checkpoint_id=f"cp{n}", checkpoint="before_dispatch", reviewer="r", outcome="accepted",
            disposition="ready_for_existing_gate", cost_usd=cost, tokens=100))]
    r = account(facts_of(review(1, 0.25), review(2, 0.5))).reviewer
    assert (r.calls.value, r.cost_usd.value, r.tokens.value) == (2, 0.75, 200)
    assert r.by_reviewer["r"]["cost_usd"].value == 0.75
    assert r.dispositions == {"ready_for_existing_gate": 2}
    # a call that ran and reported no cost: the cost is unknown, never the others' sum as if complete
    partly = account(facts_of(review(1, 0.25), review(2, None))).reviewer.cost_usd
    assert partly.value is None and partly.why == "1 of the 2 reviews that ran recorded no cost_usd (the others: 0.25)"
    unpriced = account(facts_of(review(1, None))).reviewer.cost_usd
    assert unpriced.value is None and "none of the 1 reviews that ran" in unpriced.why


# -- what turns spent ---------------------------------------------------------------------

PRICED, UNPRICED = "gpt-5", "no-such-model-anywhere"


def turn(turn_id: str, status: str, *, at: float, usage: tuple[tuple[str, int, int], ...] = ()) -> list[Envelope]:
    """A turn of thread T with one response per (model, input, output) in ``usage``."""
    out = [observed(f"start:{turn_id}", ev.TurnStarted(thread_id="T", turn_id=turn_id), at)]
    for n, (model, inp, outp) in enumerate(usage):
        out.append(observed(f"usage:{turn_id}:{n}", ev.Usage(
            thread_id="T", turn_id=turn_id, source_kind="codex_live", model=model, response_key=f"{turn_id}:{n}",
            tokens=Tokens(input=inp, cached_input=inp // 2, output=outp, reasoning=outp // 4)), at + 1 + n))
    return out + [observed(f"end:{turn_id}", ev.TurnCompleted(thread_id="T", turn_id=turn_id, status=status), at + 9)]


def cost(model: str, inp: int, outp: int) -> float:
    return bundled_table().cost(model, Tokens(input=inp, cached_input=inp // 2, output=outp, reasoning=outp // 4)).usd


def test_the_spend_of_cancelled_work_and_of_the_turns_after_each_intervention() -> None:
    stop_it = msgspec.structs.replace(intent(1, "interrupt"), expected_turn_id="U1")
    queued = msgspec.structs.replace(intent(2, "queue", at=130.0), expected_turn_id=None)
    facts = facts_of(
        turn("U0", "completed", at=90.0, usage=((PRICED, 1000, 10),)),  # before any intervention: in neither
        turn("U1", "interrupted", at=100.0, usage=((PRICED, 4000, 100), (PRICED, 6000, 300)))[:-1],
        journey(stop_it, (S.PROPOSED, S.DISPATCH_UNKNOWN, "dispatching", 105.0)),
        turn("U1", "interrupted", at=100.0)[-1:],
        journey(queued, (S.PROPOSED, S.DISPATCH_UNKNOWN, "dispatching", 131.0),
                (S.DISPATCH_UNKNOWN, S.QUEUED, "accepted", 131.5), (S.QUEUED, S.EXPIRED, "withdrawn", 132.0)),
        turn("U2", "completed", at=140.0, usage=((PRICED, 2000, 50), (UNPRICED, 500, 5))),
        turn("U3", "completed", at=160.0),  # no usage recorded
    )
    result = account(facts)
    c = result.cancelled_work
    assert c.spend.tokens == {"input": 10000, "cached_input": 5000, "cache_write": 0, "output": 400,
                              "reasoning": 100, "total": 10400}
    assert c.spend.cost_usd == pytest.approx(cost(PRICED, 4000, 100) + cost(PRICED, 6000, 300))
    assert (c.spend.turns, c.spend.turns_without_usage) == (1, 0)
    assert (c.spend_by_intent.tokens, c.spend_by_intent.cost_usd) == (c.spend.tokens, c.spend.cost_usd)
    assert c.queue_withdrawn.value == 1
    items = {item.intent_id: item for item in result.after_interventions.items}
    assert items[stop_it.id].turn_ids == ["U1"] and items[stop_it.id].spend.tokens["total"] == 10400
    after_queue = items[queued.id].spend
    assert items[queued.id].turn_ids == ["U2", "U3"] and after_queue.turns_without_usage == 1
    assert after_queue.tokens["input"] == 2500
    assert after_queue.cost_usd is None  # a response with no price: never counted as 0
    assert after_queue.cost_missing == [{"model": UNPRICED, "reason": "no_price"}]
    every = result.after_interventions.spend
    assert (every.turns, every.tokens["total"], every.cost_usd) == (3, 10400 + 2555, None)
    assert result.prices["date"] == bundled_table().date
    text = "\n".join(render_text(result))
    assert "interrupted turns spent" in text and "10400 tokens (input 10000, cached 5000, output 400)" in text
    assert f"cost n/a: no price for {UNPRICED} (no_price)" in text
    rows = {(r["section"], r["name"]): r for r in account_rows(result)}
    assert rows[("cancelled_work", "spend:total")]["value"] == 10400
    assert rows[("after_interventions", "spend:cost_usd")]["why"] == f"no price for {UNPRICED} (no_price)"


def test_turns_without_any_usage_recorded_have_no_figures_not_zeros() -> None:
    stop_it = msgspec.structs.replace(intent(1, "interrupt"), expected_turn_id="U1")
    result = account(facts_of(turn("U1", "interrupted", at=100.0)[:-1],
                              journey(stop_it, (S.PROPOSED, S.DISPATCH_UNKNOWN, "dispatching", 105.0)),
                              turn("U1", "interrupted", at=100.0)[-1:]))
    spend = result.cancelled_work.spend
    assert spend.why == "none of these turns recorded usage"
    assert set(spend.tokens.values()) == {None} and spend.cost_usd is None
    nothing = account(facts_of([])).cancelled_work.spend  # no turns: nothing spent, a figure
    assert (nothing.turns, nothing.tokens["total"], nothing.cost_usd, nothing.why) == (0, 0, 0.0, None)


def test_a_reviewer_that_lets_a_probe_through_is_flagged() -> None:
    def probe(n: int, disposition: str) -> list[Envelope]:
        return [
            Envelope(event_id=f"p{n}", source=SOURCE, at=10.0 + n, event=ev.ReviewPending(
                thread_id="T", checkpoint_id=f"probe{n}", checkpoint="before_dispatch", reviewer=f"r{n}",
                probe=True)),
            Envelope(event_id=f"c{n}", source=SOURCE, at=11.0 + n, event=ev.ReviewCommitted(
                thread_id="T", checkpoint_id=f"probe{n}", checkpoint="before_dispatch", reviewer=f"r{n}",
                outcome="accepted", disposition=disposition))]
    facts = facts_of(probe(1, "ready_for_existing_gate"), probe(2, "hold"))
    assert account(facts).reviewer.flagged == {"r1": ["probe1"]}
    assert any("FLAGGED r1" in line for line in render_text(account(facts)))


# -- recorded sessions against the raw events ------------------------------------------


def replayed_entries(config: Path) -> list[ev.Entry]:
    effective = load_effective(None, config)
    memory = MemoryRecorder()
    replay_files([str(p) for p in collect_files([str(SESSIONS)])],
                 ReplaySettings(ruleset=effective.ruleset, patterns=effective.patterns), ledger=memory)
    return list(memory.read())


def test_records_without_their_own_time_are_not_dated_by_replays_virtual_clock() -> None:
    """Claude Code's stdout carries no times: replay observes its first records at a
    virtual 0 s. Those are unknown times, not 1970, and no turn ran for 56 years."""
    memory = MemoryRecorder()
    effective = load_effective(None, None)
    replay_files([str(p) for p in collect_files([str(SESSIONS / "claude-live")])],
                 ReplaySettings(ruleset=effective.ruleset, patterns=effective.patterns), ledger=memory)
    result = account(fold_facts(memory.read()))
    assert result.first_at is not None and result.first_at > 946684800.0
    assert result.cancelled_work.turn_seconds.value < 3600


def test_report_on_recorded_sessions_equals_the_raw_event_counts() -> None:
    config = SESSIONS / "replay" / "grants.toml"
    entries = replayed_entries(config)
    events = [e.envelope.event for e in entries]
    out = CliRunner().invoke(main, ["report", "--json", "--config", str(config), str(SESSIONS)])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["events"] == len(entries)
    proposals = [e.intent for e in events if isinstance(e, ev.IntentProposed)]
    assert proposals, "the recorded sessions should make the repeated-failure rule propose"
    assert got["totals"]["proposed"]["value"] == len(proposals)
    assert Counter((g["key"]["mode"], g["key"]["task_class"]) for g in got["groups"] for _ in
                   range(g["proposed"]["value"])) == Counter((i.mode, "unlabeled") for i in proposals)
    last = {e.intent_id: e for e in events if isinstance(e, ev.IntentTransition)}
    assert got["totals"]["expired_by_reason"] == dict(Counter(t.reason for t in last.values()
                                                              if t.to_state == "expired"))
    # One turn however many sources named it (a session's stdout, transcript and hooks
    # are all replayed): counted under the id the fold knows it by once all are read.
    fold = Projection()
    for entry in entries:
        fold.apply(entry)
    interrupted = {(e.thread_id, fold.threads[e.thread_id].canonical_turn(e.turn_id)) for e in events
                   if isinstance(e, ev.TurnCompleted) and e.status == "interrupted"}
    assert got["cancelled_work"]["interrupted_turns"]["value"] == len(interrupted) > 0
    person = [e for e in events if isinstance(e, ev.Report) and not e.detail.get("shadow")
              and e.detail.get("action") != "observe"]
    assert got["owner_interruptions"]["reports"]["value"] == len(person)
    stalls = [e for e in person if " made no progress" in e.finding]
    assert got["stalls"]["detected"]["value"] == len(stalls)
    assert got["reviewer"]["calls"]["value"] == sum(isinstance(e, ev.ReviewPending) for e in events) == 0
    assert got["delivery"]["ok"] is True


def test_a_rules_task_class_labels_its_intents_and_the_unset_label_changes_no_bytes(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(rule("failing", condition={"kind": "repeated_failure", "count": 3, "within": "turn"},
                          action="steer", text="{tool} failed {count} times.", task_class="retry-loop"))
    config = tmp_path / "config.toml"
    config.write_text(grant("rule:failing", ["steer"]))
    out = CliRunner().invoke(main, ["report", "--json", "--by", "task_class", "--rules", str(rules),
                                    "--config", str(config), str(SESSIONS)])
    assert out.exit_code == 0, out.output
    assert [(g["key"], g["proposed"]["value"] > 0) for g in json.loads(out.output)["groups"]] == [
        ({"task_class": "retry-loop"}, True)]
    plain = intent(1)
    assert b"task_class" not in msgspec.json.encode(plain)
    assert b'"task_class":"x"' in msgspec.json.encode(intent(1, task_class="x"))
    assert msgspec.json.decode(msgspec.json.encode(plain), type=Intent).task_label == "unlabeled"


def test_intent_propose_task_class(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    base = ["intent", "propose", "--ledger", str(ledger), "--thread", "T", "--mode", "queue", "--text", "x", "--json"]
    labeled = CliRunner().invoke(main, [*base, "--task-class", "docs"])
    assert labeled.exit_code == 0, labeled.output
    assert json.loads(labeled.output)["task_class"] == "docs"
    plain = CliRunner().invoke(main, base)
    assert json.loads(plain.output)["task_class"] == "unlabeled"
    bad = CliRunner().invoke(main, [*base, "--task-class", "two\nlines"])
    assert bad.exit_code == 2 and "--task-class must be one line" in bad.output
    with SQLiteRecorder(ledger) as recorder:
        labels = [e.envelope.event.intent.task_label for e in recorder.read()
                  if isinstance(e.envelope.event, ev.IntentProposed)]
    assert labels == ["docs", "unlabeled"]


# -- the report database -------------------------------------------------------------------


def documented_query() -> str:
    text = (ROOT / "docs" / "usage" / "reports.md").read_text()
    block = re.search(r"<!-- report-db-query -->\s*```sh\n(?P<cmd>.*?)```", text, re.S)
    assert block, "docs/usage/reports.md shows the --db query between <!-- report-db-query --> marks"
    command = " ".join(line.rstrip("\\").strip() for line in block["cmd"].splitlines())
    return re.search(r"sqlite-utils query \S+ \"(?P<sql>[^\"]+)\"", command)["sql"]


def test_db_holds_the_account_and_its_rows_and_answers_the_documented_query(tmp_path: Path) -> None:
    batches = [journey(intent(1, task_class="docs"), *DELIVERED, (S.QUEUED, S.ACKNOWLEDGED, "echo", 104.0)),
               journey(intent(2, mode="queue"), (S.PROPOSED, S.REJECTED, "no_grant", 100.5))]
    ledger = _ledger_file(batches)
    db_path = tmp_path / "account.db"
    out = CliRunner().invoke(main, ["report", "--ledger", str(ledger), "--db", str(db_path)])
    assert out.exit_code == 0, out.output
    db = sqlite_utils.Database(db_path)
    assert {"account", "intents", "journeys", "turns", "tool_calls", "interventions", "notifications"} <= set(
        db.table_names())
    assert db["intents"].detect_fts() == "intents_fts" and db["journeys"].detect_fts() == "journeys_fts"
    assert [r["reason"] for r in db["journeys"].search("no_grant")] == ["no_grant"]
    rows = list(db.query(documented_query()))
    assert rows == [{"task_class": "docs", "mode": "steer", "intents": 1, "acknowledged": 1},
                    {"task_class": "unlabeled", "mode": "queue", "intents": 1, "acknowledged": 0}]
    # the ledger is never the report database
    refused = CliRunner().invoke(main, ["report", "--ledger", str(ledger), "--db", str(ledger)])
    assert refused.exit_code == 2 and "it is the ledger" in refused.output
    other = CliRunner().invoke(main, ["report", "--ledger", str(ledger), "--db", str(_ledger_file([]))])
    assert other.exit_code == 2 and "SQLite database tillerman did not write" in other.output
    assert sqlite3.connect(ledger).execute("select count(*) from sqlite_master where name = 'account'").fetchone() == (0,)


def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    both = CliRunner().invoke(main, ["report", "--ledger", str(tmp_path / "l"), str(SESSIONS)])
    assert both.exit_code == 2 and "not both" in both.output
    spoiled = tmp_path / "spoiled.toml"
    spoiled.write_text('[prices."gpt-5"]\ninput = -1\n')
    rules_on_ledger = CliRunner().invoke(main, ["report", "--ledger", str(_ledger_file([])), "--rules",
                                                str(SESSIONS / "replay" / "grants.toml"), "--config", str(spoiled)])
    # the options are checked before the price table is read: the spoiled config is not what is said
    assert rules_on_ledger.exit_code == 2 and rules_on_ledger.output == (
        "Error: --rules applies to SESSION files only; a ledger records its own rule sets\n")
    bad_time = CliRunner().invoke(main, ["report", "--since", "yesterday", str(SESSIONS)])
    assert bad_time.exit_code == 2


def test_on_a_ledger_config_overrides_the_prices(tmp_path: Path) -> None:
    stop_it = msgspec.structs.replace(intent(1, "interrupt"), expected_turn_id="U1")
    ledger = _ledger_file([turn("U1", "interrupted", at=100.0, usage=((PRICED, 4000, 100),))[:-1],
                           journey(stop_it, (S.PROPOSED, S.DISPATCH_UNKNOWN, "dispatching", 105.0)),
                           turn("U1", "interrupted", at=100.0)[-1:]])
    config = tmp_path / "config.toml"
    config.write_text(f'[prices."{PRICED}"]\ninput = 100.0\ncached_input = 10.0\noutput = 1000.0\n')
    out = CliRunner().invoke(main, ["report", "--json", "--ledger", str(ledger), "--config", str(config)])
    assert out.exit_code == 0, out.output
    spent = json.loads(out.output)["cancelled_work"]["spend"]["cost_usd"]
    assert spent == pytest.approx((2000 * 100.0 + 2000 * 10.0 + 100 * 1000.0) / 1e6)  # input less the cached part
    assert spent != pytest.approx(cost(PRICED, 4000, 100))


@pytest.mark.parametrize("by", ["task_class", "mode", "rule", "owner", "thread"])
def test_every_by_label_groups(by: str) -> None:
    facts = facts_of(journey(intent(1, owner="ann", rule_id="r1")), journey(intent(2, mode="queue")))
    keys = sorted(g.key[by] for g in account(facts, by=(by,)).groups)
    expected = {"task_class": ["unlabeled"], "mode": ["queue", "steer"], "rule": ["(none)", "r1"],
                "owner": ["ann", "owner:unknown"], "thread": ["T"]}[by]
    assert keys == expected


def budget_report(key: str, at: float, **detail) -> Envelope:
    """A budget rule's report as ``tillerman.rules.detect`` and the supervisor record it."""
    return Envelope(event_id=f"report:{key}", source=SOURCE, at=at, event=ev.Report(
        thread_id="T", turn_id="U", rule_id=detail.pop("rule", "spend"), rule_version=1, finding="over",
        detail={"per": "thread", "instance": "T", "source_kind": "codex_live", "status": "active", **detail}))


def test_the_report_lists_each_budget_crossing_with_its_figure_and_its_intents_end() -> None:
    wrap_up = intent(1, rule_id="spend")
    batches = [
        journey(wrap_up, *DELIVERED, (S.QUEUED, S.ACKNOWLEDGED, "echo", 103.0)),
        [budget_report("steer", 100.0, measure="tokens", figure=1234, limit=1000, usage_seq=7, action="steer",
                       proposed=wrap_up.id),
         budget_report("cost", 110.0, rule="daily", measure="cost_usd", figure=2.5, limit=2.0, per="day",
                       instance="2026-06-13", usage_seq=9, price_date="2026-06-01", unpriced_models="mystery",
                       action="report_overdue"),
         # a report of another rule is no crossing
         Envelope(event_id="report:other", source=SOURCE, at=111.0, event=ev.Report(
             thread_id="T", rule_id="stall", rule_version=1, finding="quiet", detail={"action": "report_overdue"}))],
    ]
    shown = CliRunner().invoke(main, ["report", "--json", "--ledger", str(_ledger_file(batches))])
    assert shown.exit_code == 0, shown.output
    budgets = json.loads(shown.output)["budgets"]
    assert budgets["crossings"]["value"] == 2
    steer, cost = budgets["items"]
    assert {k: steer[k] for k in ("rule_id", "thread_id", "turn_id", "measure", "figure", "limit", "per", "instance",
                                  "source_kind", "usage_seq", "action", "intent_id", "intent_state")} == {
        "rule_id": "spend", "thread_id": "T", "turn_id": "U", "measure": "tokens", "figure": 1234, "limit": 1000,
        "per": "thread", "instance": "T", "source_kind": "codex_live", "usage_seq": 7, "action": "steer",
        "intent_id": wrap_up.id, "intent_state": "acknowledged"}
    assert steer["intent_reason"] == "echo" and steer["price_date"] is None
    assert (cost["price_date"], cost["unpriced_models"], cost["intent_id"], cost["intent_state"]) == (
        "2026-06-01", "mystery", None, None)
    text = "\n".join(render_text(account(facts_of(*batches))))
    assert "spend: tokens per thread (T) reached 1,234, limit 1,000; thread T, turn U; source codex_live," \
           " usage row 7" in text
    assert f"steer {wrap_up.id}: acknowledged (echo)" in text
    assert "priced with the table dated 2026-06-01; no price for mystery (a lower bound)" in text
