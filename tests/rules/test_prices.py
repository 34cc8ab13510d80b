"""The price table: ccusage's name matching, the cost of a response, the bundled table."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from tillerman.ledger.usage import Tokens
from tillerman.rules.prices import (
    ModelPrice,
    PriceFileError,
    PriceOverride,
    PriceTable,
    Rates,
    Tier,
    best_key,
    bundled_table,
    effective_rates,
    is_claude,
    load_prices,
    model_price,
    response_cost,
)
from tillerman.rules.prices_trim import encode

KEYS = ["claude-sonnet-4", "claude-sonnet-4-20250514", "claude-opus-4-1", "gpt-5", "gpt-5.1", "gpt-5-mini",
        "openai/o3", "claude-3-5-haiku-20241022", "a-model", "b-model"]


@pytest.mark.parametrize(("model", "key"), [
    ("gpt-5", "gpt-5"),  # exact
    ("claude-sonnet-4-20250514", "claude-sonnet-4-20250514"),
    ("anthropic/claude-sonnet-4-20250514", "claude-sonnet-4-20250514"),  # a gateway's prefix
    ("claude-sonnet-4-20250601", "claude-sonnet-4"),  # an 8-digit date is the same model
    ("claude-sonnet-4@20250514", "claude-sonnet-4-20250514"),  # Vertex: @ read as -
    ("gpt-5-1", "gpt-5.1"),  # . read as -
    ("gpt-5.2", None),  # a number after a key ending in a digit is another version
    ("claude-opus-4-1-2", None),
    ("claude-opus-4", None),  # no key contains it at a boundary, none it contains
    ("gpt-5-codex", "gpt-5"),  # a word after the key is a variant of it
    ("gpt-5x", None),  # letters after it are another name
    ("xgpt-5", None),  # and before it
    ("o3", "openai/o3"),  # a key that contains the name
    ("model", "a-model"),  # keys of equal length: the first in text order
    ("", None),
    ("claude-3-5-haiku", "claude-3-5-haiku-20241022"),
])
def test_a_model_name_finds_its_key_as_ccusage_finds_it(model, key) -> None:
    assert best_key(model, KEYS) == key


def table(**models: ModelPrice) -> PriceTable:
    return PriceTable(models, date="2026-12-01", source="test", digest="sha256:0")


GPT = ModelPrice(rates=Rates(input=1e-6, output=10e-6), context_window=272_000,
                 tiers=(Tier(above=272_000, rates=Rates(input=2e-6, cached_input=0.2e-6, output=15e-6)),))
CLAUDE = ModelPrice(rates=Rates(input=3e-6, output=15e-6), fast=6.0,
                    tiers=(Tier(above=200_000, rates=Rates(input=6e-6, output=22.5e-6, cache_write=7.5e-6)),))
EXPLICIT = ModelPrice(rates=Rates(input=3e-6, cached_input=0.25e-6, cache_write=4e-6, cache_write_1h=5e-6,
                                  output=15e-6))
PRICES = table(**{"gpt-x": GPT, "claude-y": CLAUDE, "claude-z": EXPLICIT})


@pytest.mark.parametrize(("model", "tokens", "speed", "usd"), [
    # uncached input, cached input, output: each at its rate, cached never added twice
    ("gpt-x", Tokens(input=1000, cached_input=400, output=100, reasoning=60), None, 600e-6 + 400e-6 + 1000e-6),
    # OpenAI without a read rate: cached input at the input rate; a write is input
    ("gpt-x", Tokens(input=1000, cached_input=1000), None, 1000e-6),
    ("gpt-x", Tokens(input=1000, cache_write=1000), None, 1000e-6),
    # Claude without cache rates: read 0.1x, 5-minute write 1.25x, 1-hour write 2x input
    ("claude-y", Tokens(input=1000, cached_input=1000), None, 300e-6),
    ("claude-y", Tokens(input=1000, cache_write=1000), None, 3750e-6),
    ("claude-y", Tokens(input=1000, cache_write=1000, cache_write_1h=1000), None, 6000e-6),
    # the table's own rates win
    ("claude-z", Tokens(input=1000, cached_input=100, cache_write=300, cache_write_1h=200, output=10), None,
     600 * 3e-6 + 100 * 0.25e-6 + 100 * 4e-6 + 200 * 5e-6 + 10 * 15e-6),
    # a tier applies above its threshold, not at it, and then to the whole response
    ("gpt-x", Tokens(input=272_000, output=1), None, 272_000e-6 + 10e-6),
    ("gpt-x", Tokens(input=272_001, cached_input=1, output=1), None, 272_000 * 2e-6 + 0.2e-6 + 15e-6),
    # a tier without a read rate: derived from the tier's input
    ("claude-y", Tokens(input=200_001, cached_input=200_000, cache_write=1), None, 200_000 * 0.6e-6 + 7.5e-6),
    # fast mode multiplies by the model's factor
    ("claude-y", Tokens(input=1000, output=100), "fast", 6 * (3000e-6 + 1500e-6)),
    ("claude-y", Tokens(input=1000, output=100), "standard", 3000e-6 + 1500e-6),
])
def test_a_response_costs_each_part_at_its_rate(model, tokens, speed, usd) -> None:
    cost = PRICES.cost(model, tokens, speed=speed)
    assert cost.usd == pytest.approx(usd, rel=1e-12) and cost.missing is None and cost.date == "2026-12-01"


def test_the_rates_kept_per_model_and_tier_price_each_response_at_its_own_tier() -> None:
    """One table prices responses on both sides of a tier in any order, each as if it
    were the first: the rates it keeps are per tier passed, not per model."""
    prices = table(**{"gpt-x": GPT, "claude-y": CLAUDE})
    small, large = Tokens(input=1000, cached_input=10, output=5), Tokens(input=300_000, cached_input=10, output=5)
    for model, tokens in [("gpt-x", small), ("gpt-x", large), ("gpt-x", small), ("claude-y", large),
                          ("claude-y", small), ("claude-y", large)]:
        price = prices.models[model]
        alone = response_cost(effective_rates(price, tokens.input, claude=is_claude(model)), tokens)
        assert prices.cost(model, tokens).usd == alone


@pytest.mark.parametrize(("model", "speed", "missing"), [
    (None, None, "no_model"), ("", None, "no_model"), ("llama-9", None, "no_price"),
    ("gpt-x", "fast", "no_price"),  # no fast factor: the standard price would be a guess
])
def test_an_unknown_cost_is_null_with_its_reason_never_0(model, speed, missing) -> None:
    cost = PRICES.cost(model, Tokens(input=10, output=1), speed=speed)
    assert (cost.usd, cost.missing, cost.date) == (None, missing, "2026-12-01")


def test_the_context_window_is_matched_among_the_entries_that_have_one() -> None:
    windows = table(**{"gpt-5": ModelPrice(rates=Rates(input=1e-6, output=1e-6)),
                       "openai/gpt-5": ModelPrice(rates=Rates(input=1e-6, output=1e-6), context_window=400_000)})
    assert windows.context_window("gpt-5") == 400_000
    assert windows.context_window("claude-x") is None and PRICES.context_window("gpt-x-2025") == 272_000


def test_an_override_replaces_the_rates_it_gives_and_keeps_the_rest() -> None:
    overrides = {"gpt-x-2026": PriceOverride(rates=Rates(input=0.5e-6), context_window=500_000),
                 "local-model": PriceOverride(rates=Rates(input=1e-6, output=2e-6))}
    changed = PRICES.with_overrides(overrides)
    assert changed.cost("gpt-x-2026", Tokens(input=1000, output=10)).usd == pytest.approx(500e-6 + 100e-6)
    assert changed.cost("gpt-x", Tokens(input=1000)).usd == pytest.approx(1000e-6)  # the table's entry stays
    assert changed.context_window("gpt-x-2026") == 500_000
    assert changed.cost("local-model", Tokens(input=1000, output=1000)).usd == pytest.approx(3000e-6)


def test_an_override_of_rates_is_the_price_at_every_size_the_tables_tiers_go() -> None:
    """gpt-5.5 has a tier above 272k input tokens in the table; the user's $100/$1000 a
    million hold for a response of 1M input and 1M output too (the tier priced it $55)."""
    bundled = bundled_table()
    changed = bundled.with_overrides({"gpt-5.5": PriceOverride(rates=Rates(input=100e-6, output=1000e-6))})
    assert changed.cost("gpt-5.5", Tokens(input=1_000_000, output=1_000_000)).usd == pytest.approx(1100.0)
    assert changed.models["gpt-5.5"].tiers == ()
    only_window = bundled.with_overrides({"gpt-5.5": PriceOverride(context_window=500_000)})
    assert only_window.models["gpt-5.5"].tiers == bundled.models["gpt-5.5"].tiers  # no rate given: tiers kept


def test_an_override_for_a_model_without_a_price_needs_input_and_output() -> None:
    with pytest.raises(PriceFileError, match=r'\[prices."llama-9"\]: the price table has no price for llama-9; give'
                                             " both input and output"):
        PRICES.with_overrides({"llama-9": PriceOverride(rates=Rates(input=1e-6))})


def test_an_entry_without_an_input_or_output_rate_is_no_price() -> None:
    assert model_price("gpt-image", {"input_cost_per_token": 1e-6}) is None


def test_the_bundled_table_is_dated_and_in_the_trimmed_form() -> None:
    text = resources.files("tillerman.rules").joinpath("prices.json").read_text(encoding="utf-8")
    assert encode(json.loads(text)) == text  # what prices_trim writes, untouched by hand
    bundled = bundled_table()
    assert bundled.date == "2026-12-06" and bundled.digest.startswith("sha256:") and len(bundled.models) > 300
    assert all(key.startswith(("claude-", "gpt-", "anthropic", "openai/", "azure/", "openrouter/openai/", "us.",
                               "eu.", "global.", "jp.", "au.")) for key in bundled.models)
    # the models the agents use, with their tiers and fast factors
    assert bundled.match("claude-opus-4-8") == "claude-opus-4-8" and bundled.models["claude-opus-4-8"].fast == 2.0
    assert [tier.above for tier in bundled.models["gpt-5.5"].tiers] == [272_000]
    assert bundled.cost("gpt-5.5", Tokens(input=1_000_000, output=1_000_000)).usd == pytest.approx(10 + 45)


def test_load_prices_reads_the_imported_table_else_the_bundled_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert load_prices().digest == bundled_table().digest
    stored = tmp_path / "tillerman" / "prices.json"
    stored.parent.mkdir()
    stored.write_text(json.dumps({"date": "2027-01-01", "source": "mine", "digest": "sha256:1", "models": {
        "gpt-q": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}}}))
    assert load_prices().date == "2027-01-01" and set(load_prices().models) == {"gpt-q"}
    overridden = load_prices({"gpt-q": PriceOverride(rates=Rates(output=4e-6))})
    assert overridden.cost("gpt-q", Tokens(output=1)).usd == pytest.approx(4e-6)
    stored.write_text('{"date": "x", "source": "y", "digest": "z", "models": {"gpt-q": {"input_cost_per_token": -1,'
                      ' "output_cost_per_token": 1}}}')
    with pytest.raises(PriceFileError, match=f'{stored}: model "gpt-q" field input_cost_per_token: -1 is negative'):
        load_prices()
    stored.write_text("not json")
    with pytest.raises(PriceFileError, match=f"{stored}: not JSON"):
        load_prices()
