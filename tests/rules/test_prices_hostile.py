"""Hostile price files and price overrides: each bad input is a one-line error that
names the model and the field, never a crash and never a price of 0."""

from __future__ import annotations

import errno
import hashlib
import json
import os

import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main
from tillerman.rules.errors import RuleSetError
from tillerman.rules.price_config import load_price_overrides
from tillerman.rules.prices import PriceFileError, read_json
from tillerman.rules.prices_trim import trim

GOOD = '"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06'


@pytest.mark.parametrize(("text", "error"), [
    ("{", "not JSON"),
    ("", "not JSON"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    ("[1, 2]", "the top level is not an object of models"),
    ("{}", "no Claude or OpenAI model with an input and an output price"),
    ('{"llama-3": {' + GOOD + "}}", "no Claude or OpenAI model"),  # nothing kept
    ('{"gpt-5": {"input_cost_per_token": 1e-06}}', "no Claude or OpenAI model"),  # no output rate
    ('{"gpt-5": [1]}', 'model "gpt-5": not an object of prices'),
    ('{"gpt-5": {"input_cost_per_token": -1e-06, "output_cost_per_token": 1e-06}}',
     'model "gpt-5" field input_cost_per_token: -1e-06 is negative'),
    ('{"gpt-5": {"input_cost_per_token": NaN, "output_cost_per_token": 1e-06}}',
     'model "gpt-5" field input_cost_per_token: nan is not a finite number'),
    ('{"gpt-5": {"input_cost_per_token": 1e-06, "output_cost_per_token": Infinity}}',
     'model "gpt-5" field output_cost_per_token: inf is not a finite number'),
    ('{"gpt-5": {"input_cost_per_token": 1e400, "output_cost_per_token": 1e-06}}',
     'model "gpt-5" field input_cost_per_token: inf is not a finite number'),
    ('{"gpt-5": {"input_cost_per_token": "0.000001", "output_cost_per_token": 1e-06}}',
     'model "gpt-5" field input_cost_per_token: "0.000001" is not a number'),
    ('{"gpt-5": {"input_cost_per_token": true, "output_cost_per_token": 1e-06}}',
     'model "gpt-5" field input_cost_per_token: true is not a number'),
    ('{"gpt-5": {"input_cost_per_token": 1.25, "output_cost_per_token": 1e-06}}',
     'model "gpt-5" field input_cost_per_token: 1.25 is above $1 a token (a price per million tokens in a per-token'
     " field?)"),
    ('{"claude-x": {' + GOOD + ', "cache_read_input_token_cost_above_200k_tokens": -3}}',
     'model "claude-x" field cache_read_input_token_cost_above_200k_tokens: -3 is negative'),
    ('{"claude-x": {' + GOOD + ', "cache_creation_input_token_cost_above_1hr": null, "cache_creation_input_token_cost":'
     ' {"a": 1}}}', 'model "claude-x" field cache_creation_input_token_cost: {"a": 1} is not a number'),
    ('{"gpt-5": {' + GOOD + ', "max_input_tokens": "lots"}}',
     'model "gpt-5" field max_input_tokens: "lots" is not a whole number of tokens'),
    ('{"gpt-5": {' + GOOD + ', "max_input_tokens": -5}}', 'model "gpt-5" field max_input_tokens: -5 is out of range'),
    ('{"gpt-5": {' + GOOD + ', "max_input_tokens": 1e30}}', 'model "gpt-5" field max_input_tokens: 1e+30 is out of'),
    ('{"claude-x": {' + GOOD + ', "provider_specific_entry": {"fast": 0}}}',
     'model "claude-x" field provider_specific_entry.fast: 0 is out of range (1 to 100)'),
    ('{"claude-x": {' + GOOD + ', "provider_specific_entry": {"fast": "2"}}}',
     'model "claude-x" field provider_specific_entry.fast: "2" is not a finite number'),
    ('{"claude-x": {' + GOOD + ', "provider_specific_entry": 7}}',
     'model "claude-x" field provider_specific_entry: 7 is not an object'),
    ("[" * 100_000, "not JSON"),  # nested past the parser's depth
])
def test_a_bad_price_file_is_refused_in_one_line_naming_model_and_field(tmp_path, text, error) -> None:
    path = tmp_path / "prices.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PriceFileError) as caught:
        trim(read_json(path)[1])
    assert error in str(caught.value) and "\n" not in str(caught.value)


def test_a_figure_outside_the_kept_models_and_fields_is_not_read(tmp_path) -> None:
    path = tmp_path / "prices.json"
    path.write_text('{"sample_spec": {"max_input_tokens": "max input tokens"}, "gpt-5": {' + GOOD
                    + ', "input_cost_per_token_batches": "x", "search_context_cost_per_query": -1}}')
    assert trim(read_json(path)[1]) == {"gpt-5": {"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06}}


def test_a_fifo_is_refused_not_waited_on(tmp_path) -> None:
    fifo = tmp_path / "prices.json"
    os.mkfifo(fifo)
    with pytest.raises(PriceFileError, match="a FIFO"):
        read_json(fifo)


# -- tillerman prices import: the table in use stays -------------------------------------


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "data" / "tillerman" / "prices.json"


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_import_refuses_a_bad_file_and_keeps_the_table_in_use(tmp_path, data_home) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text('{"gpt-5": {' + GOOD + ', "max_input_tokens": 400000}, "llama": {}}')
    done = run("prices", "import", good, "--date", "2026-11-30", "--source", "LiteLLM main")
    assert done.exit_code == 0, done.output
    assert "Imported prices for 1 models, dated 2026-11-30" in done.output
    kept = data_home.read_bytes()
    bad.write_text('{"gpt-5": {"input_cost_per_token": -1, "output_cost_per_token": 1e-06}}')
    refused = run("prices", "import", bad)
    assert refused.exit_code == 2
    assert refused.output == (f'Error: cannot import {bad}: model "gpt-5" field input_cost_per_token: -1 is negative;'
                              " the price table in use is unchanged\n")
    assert data_home.read_bytes() == kept and os.listdir(data_home.parent) == ["prices.json"]
    shown = run("prices", "show", "--json")
    assert '"date": "2026-11-30"' in shown.output and '"source": "LiteLLM main"' in shown.output


@pytest.mark.parametrize("date", ["yesterday", "2026-13-01", "2026-1-1", "20261201"])
def test_import_refuses_a_date_that_is_not_one(tmp_path, data_home, date) -> None:
    good = tmp_path / "good.json"
    good.write_text('{"gpt-5": {' + GOOD + "}}")
    result = run("prices", "import", good, "--date", date)
    assert result.exit_code == 2 and "is not a date; write it as YYYY-MM-DD" in result.output
    assert not data_home.exists()


def test_show_prints_a_model_s_key_and_rates_or_no_price(data_home) -> None:
    priced = run("prices", "show", "anthropic/claude-opus-4-8")
    assert priced.exit_code == 0
    assert priced.output.splitlines() == [
        "anthropic/claude-opus-4-8: priced as claude-opus-4-8 (table dated 2026-12-06), USD per million tokens",
        "  input 5, cached_input 0.5, cache_write 6.25, cache_write_1h 10, output 25",
        "  context window: 1000000; fast factor: 2.0"]
    unknown = run("prices", "show", "llama-9", "--json")
    assert unknown.exit_code == 0 and '"missing": "no_price"' in unknown.output and '"key": null' in unknown.output


def test_import_json_says_what_was_stored(tmp_path, data_home) -> None:
    good = tmp_path / "good.json"
    good.write_text('{"gpt-5": {' + GOOD + '}, "claude-x": {' + GOOD + '}, "llama": {}}')
    done = run("prices", "import", good, "--date", "2026-11-30", "--source", "LiteLLM main", "--json")
    assert done.exit_code == 0, done.output
    shown = json.loads(run("prices", "show", "--json").output)
    assert json.loads(done.output) == {"models": 2, "date": "2026-11-30", "source": "LiteLLM main",
                                       "digest": shown["digest"], "path": str(data_home)}
    assert shown["digest"] == "sha256:" + hashlib.sha256(good.read_bytes()).hexdigest()


def _too_long_data_home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / ("x" * 5000)))


def _unreadable_midway(tmp_path, monkeypatch) -> None:
    def fails(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error", str(tmp_path / "good.json"))

    monkeypatch.setattr("tillerman.rules.prices_trim.table_document", fails)


@pytest.mark.parametrize(("command", "fault", "error"), [
    ("show", _too_long_data_home, "File name too long"),
    ("import", _unreadable_midway, "Input/output error"),  # the path before it may be shortened
])
def test_an_unexpected_error_is_one_line_not_a_traceback(tmp_path, data_home, monkeypatch, command, fault,
                                                         error) -> None:
    good = tmp_path / "good.json"
    good.write_text('{"gpt-5": {' + GOOD + "}}")
    fault(tmp_path, monkeypatch)
    result = run("prices", command, *([good] if command == "import" else []))
    assert result.exit_code == 2
    assert result.output.startswith("Error: ") and error in result.output and result.output.count("\n") == 1


# -- [prices."MODEL"] in the config file ----------------------------------------------------


@pytest.mark.parametrize(("body", "error"), [
    ("prices = 3\n", "c.toml:1: top level field prices: must be a table of models"),
    ('[prices]\n"gpt-5" = 1.25\n', 'c.toml:2: prices."gpt-5": must be a table of prices (got 1.25)'),
    ('[prices."gpt-5.5"]\ninput = -1\n', 'c.toml:2: prices."gpt-5.5" field input: must be a number of USD per million'
                                          " tokens from 0 to 1,000,000 (got -1); write it like input = 1.25"),
    ('[prices."gpt-5"]\n\noutput = "10"\n', 'c.toml:3: prices."gpt-5" field output: must be a number of USD per'
                                            ' million tokens from 0 to 1,000,000 (got "10")'),
    ('[prices."gpt-5"]\ncached_input = nan\n', 'c.toml:2: prices."gpt-5" field cached_input: must be a number'),
    ('[prices."gpt-5"]\ncache_write = inf\n', 'c.toml:2: prices."gpt-5" field cache_write: must be a number'),
    ('[prices."gpt-5"]\ncache_write_1h = 2000000\n', 'c.toml:2: prices."gpt-5" field cache_write_1h: must be a'),
    ('[prices."gpt-5"]\ncontext_window = 0\n', 'c.toml:2: prices."gpt-5" field context_window: must be a whole'
                                               " number of tokens from 1 to 1000000000 (got 0)"),
    ('[prices."gpt-5"]\ncontext_window = 1.5\n', 'c.toml:2: prices."gpt-5" field context_window: must be a whole'),
    ('[prices."gpt-5"]\nfast = 0.5\n', 'c.toml:2: prices."gpt-5" field fast: must be a number from 1 to 100'),
    ('[prices."gpt-5"]\ninptu = 1\n', 'c.toml:2: prices."gpt-5" field inptu: unknown field; expected one of input,'),
    ('[prices.""]\ninput = 1\n', 'c.toml:1: prices."": the model name is empty'),
])
def test_a_bad_price_override_is_a_line_accurate_error(body, error) -> None:
    with pytest.raises(RuleSetError) as caught:
        load_price_overrides(body, "c.toml")
    assert str(caught.value).startswith(error), str(caught.value)


def test_overrides_are_per_million_tokens_and_show_applies_them(tmp_path, data_home) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[patterns]\ncritical = []\n\n[prices."gpt-5.5"]\ninput = 4\ncached_input = 0.4\n\n'
                      '[prices."my-model"]\ninput = 1\noutput = 2\ncontext_window = 32000\n')
    overrides = load_price_overrides(config.read_text(), str(config))
    assert overrides["gpt-5.5"].rates.input == pytest.approx(4e-6) and overrides["my-model"].context_window == 32000
    shown = run("prices", "show", "gpt-5.5", "--config", config)
    assert "  input 4, cached_input 0.4, cache_write 4, cache_write_1h 8, output 30" in shown.output
    unpriced = tmp_path / "unpriced.toml"
    unpriced.write_text('[prices."llama-9"]\ninput = 1\n')
    refused = run("prices", "show", "--config", unpriced)
    assert refused.exit_code == 2 and 'no price for llama-9; give both input and output' in refused.output
