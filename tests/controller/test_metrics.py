"""What ``--metrics`` counts from the rows the daemon folds, and which addresses it serves on."""

from __future__ import annotations

import pytest

from tillerman.controller.core import intent_requests
from tillerman.controller.daemon.metrics import Metrics, parse_address
from tillerman.ledger import projections
from tillerman.ledger.events import Entry, Envelope, IntentTransition, NotificationFailed, ReviewCommitted
from tillerman.ledger.intent_states import State
from tillerman.ledger.memory import MemoryRecorder


def _entry(seq: int, event, source: str = "tillerman") -> Entry:
    return Entry(seq=seq, envelope=Envelope(event_id=str(seq), event=event, source=source), prev_hash="", hash="")


def test_reviewer_calls_notification_failures_and_intent_moves_are_counted():
    metrics = Metrics()
    for seq, event in enumerate([
        ReviewCommitted(checkpoint_id="c1", outcome="accepted"), ReviewCommitted(checkpoint_id="c2",
                                                                                 outcome="review_failed:timeout"),
        NotificationFailed(sink="pager", keys=("overdue:i@ack",), error="exited 1", retry_in=2.0),
        IntentTransition(intent_id="i", from_state="proposed", to_state="rejected", reason="no_grant"),
    ], start=1):
        metrics.fold(_entry(seq, event))
    value = metrics.registry.get_sample_value
    assert value("tillerman_reviewer_calls_total", {"outcome": "accepted"}) == 1
    assert value("tillerman_reviewer_calls_total", {"outcome": "review_failed:timeout"}) == 1
    assert value("tillerman_notification_failures_total", {"sink": "pager"}) == 1
    assert (value("tillerman_intents", {"state": "proposed"}), value("tillerman_intents", {"state": "rejected"})) == (
        -1, 1)  # a move out of a state the start did not count: the gauges follow the moves
    assert value("tillerman_events_ingested_total", {"source": "tillerman"}) == 4


def test_the_start_sets_every_state_from_the_fold_whatever_was_folded_before():
    rec = MemoryRecorder()
    intent = intent_requests.propose(rec, thread_id="T", mode="queue", text="x", owner="bob")
    intent_requests.transition(rec, intent.id, State.REJECTED, "no_grant")
    metrics = Metrics()
    for entry in rec.read():  # the daemon's first fold, before it counts from its start
        metrics.fold(entry)
    metrics.start(projections.load(rec))
    value = metrics.registry.get_sample_value
    assert [value("tillerman_intents", {"state": s.value}) for s in State] == [
        1 if s is State.REJECTED else 0 for s in State]


@pytest.mark.parametrize(("text", "address"), [("127.0.0.1:9464", ("127.0.0.1", 9464)),
                                               ("localhost:1", ("localhost", 1)), ("[::1]:9464", ("::1", 9464))])
def test_loopback_addresses_are_served(text, address):
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["9464", ":9464", "127.0.0.1:", "127.0.0.1:70000", "192.168.1.5:9464",
                                  "example.com:9464"])
def test_other_addresses_are_refused(text):
    with pytest.raises(ValueError, match="--metrics"):
        parse_address(text)


def _usage(seq: int, thread: str, model: str, inp: int, outp: int, *, key: str | None = None) -> Entry:
    from tillerman.ledger.events import Usage
    from tillerman.ledger.usage import Tokens
    return _entry(seq, Usage(thread_id=thread, turn_id="U", source_kind="codex_live", model=model,
                             response_key=key or f"{thread}:{seq}",
                             tokens=Tokens(input=inp, cached_input=inp // 2, output=outp, reasoning=outp // 2)),
                  source="appserver:x")


def test_usage_tokens_by_kind_and_cost_per_thread_and_model_counted_once():
    from tillerman.rules.prices import bundled_table
    from tillerman.ledger.usage import Tokens
    metrics = Metrics()
    for entry in [_usage(1, "T1", "gpt-5", 1000, 100), _usage(2, "T1", "gpt-5", 3000, 300),
                  _usage(3, "T1", "gpt-5", 3000, 300, key="T1:2"),  # the rollout's copy of the second: once
                  _usage(4, "T2", "no-such-model-anywhere", 500, 50)]:
        metrics.fold(entry)
    value = metrics.registry.get_sample_value
    one = {"thread": "T1", "model": "gpt-5"}
    assert [value("tillerman_usage_tokens", one | {"kind": k}) for k in
            ("input", "cached_input", "cache_write", "output", "reasoning")] == [4000, 2000, 0, 400, 200]
    table = bundled_table()
    expected = sum(table.cost("gpt-5", Tokens(input=i, cached_input=i // 2, output=o, reasoning=o // 2)).usd
                   for i, o in ((1000, 100), (3000, 300)))
    assert value("tillerman_usage_cost_usd", one) == pytest.approx(expected)
    unpriced = {"thread": "T2", "model": "no-such-model-anywhere"}
    assert value("tillerman_usage_unpriced_responses", unpriced) == 1  # no price: not a cost of 0
    assert value("tillerman_usage_cost_usd", unpriced) is None


def test_thread_and_model_labels_are_bounded(monkeypatch):
    from tillerman.controller.daemon import metrics as module
    monkeypatch.setattr(module, "MAX_THREAD_LABELS", 2)
    metrics = Metrics()
    for seq, thread in enumerate(["A", "B", "C", "D"], start=1):
        metrics.fold(_usage(seq, thread, "gpt-5", 100, 10))
    threads = {s.labels["thread"] for m in metrics.registry.collect() if m.name == "tillerman_usage_tokens"
               for s in m.samples}
    assert threads == {"A", "B", "other"}
    assert metrics.registry.get_sample_value("tillerman_usage_tokens",
                                             {"thread": "other", "model": "gpt-5", "kind": "input"}) == 200


def _claude(seq: int, *, output: int) -> Entry:
    """A Claude Code entry of message m1, request r1 (its copies are one response)."""
    from tillerman.ledger.events import Usage
    from tillerman.ledger.usage import Tokens
    return _entry(seq, Usage(thread_id="T", turn_id="U", source_kind="claude_transcript", model="claude-sonnet-4-5",
                             message_id="m1", request_id="r1", tokens=Tokens(input=100, output=output)),
                  source="file:/t.jsonl")


def test_a_better_duplicate_moves_the_usage_gauges_to_its_figures():
    metrics = Metrics()
    for entry in [_claude(1, output=1), _claude(2, output=40)]:  # the streaming placeholder, then the final copy
        metrics.fold(entry)
    labels = {"thread": "T", "model": "claude-sonnet-4-5"}
    assert metrics.registry.get_sample_value("tillerman_usage_tokens", labels | {"kind": "output"}) == 40
    assert metrics.registry.get_sample_value("tillerman_usage_tokens", labels | {"kind": "input"}) == 100


@pytest.fixture
def price_homes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(Metrics, "serve", lambda self, address: None)  # no port is opened
    return tmp_path


def test_run_metrics_price_usage_with_the_configs_overrides(price_homes):
    from tillerman.controller.cli.main import serve_metrics
    from tillerman.rules.config import load_effective
    config = price_homes / "config.toml"
    config.write_text('[prices."gpt-5.5"]\ninput = 100.0\noutput = 1000.0\n')
    metrics = serve_metrics("127.0.0.1:9464", load_effective(None, config).ruleset)
    metrics.fold(_usage(1, "T", "gpt-5.5", 100_000, 100_000))
    # 50k uncached input at 100 and 100k output at 1000 USD per million (the 50k cached: 0.025), not the bundled price
    assert metrics.registry.get_sample_value("tillerman_usage_cost_usd", {"thread": "T", "model": "gpt-5.5"}) \
        == pytest.approx(5.0 + 0.025 + 100.0)


def test_run_metrics_with_a_spoiled_imported_price_table_is_one_line_exit_2(price_homes):
    from tillerman.controller.cli.main import serve_metrics
    from tillerman.controller.cli.output import Fail
    from tillerman.rules.config import load_effective
    spoiled = price_homes / "data" / "tillerman" / "prices.json"
    spoiled.parent.mkdir(parents=True)
    spoiled.write_text('{"models": {"gpt-5.5": {"input": -1}}}')
    with pytest.raises(Fail) as caught:
        serve_metrics("127.0.0.1:9464", load_effective(None, None).ruleset)
    assert caught.value.exit_code == 2 and str(caught.value).startswith(str(spoiled)) and "\n" not in str(caught.value)
