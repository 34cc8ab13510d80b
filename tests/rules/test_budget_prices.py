"""The config's price overrides reach the budgets' price table, are recorded with the rule
set so replay prices the same, and a spoiled imported table is a one-line rule-set error."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fixtures.rule_texts import rule
from tillerman.controller.cli.main import main
from tillerman.controller.daemon.reload import RuleReloader
from tillerman.ledger import events as ev
from tillerman.ledger.usage import Tokens
from tillerman.rules.config import check_file, load_effective
from tillerman.rules.errors import RuleSetError
from tillerman.rules.ruleset import ruleset_from_text, ruleset_text

COST_RULE = rule("spend", condition={"kind": "budget", "measure": "cost_usd", "over": 5.0, "per": "thread"},
                 action="report_overdue")
OVERRIDE = '[prices."gpt-5.5"]\ninput = 100.0\noutput = 1000.0\n'


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = tmp_path / "data" / "tillerman" / "prices.json"
    path.parent.mkdir(parents=True)
    return path


def files(tmp_path, config: str):
    rules, config_path = tmp_path / "rules.toml", tmp_path / "config.toml"
    rules.write_text(COST_RULE)
    config_path.write_text(config)
    return rules, config_path


def test_overrides_price_the_budgets_and_replay_rebuilds_them(tmp_path, data_home):
    rules, config = files(tmp_path, OVERRIDE)
    effective = load_effective(rules, config)
    tokens = Tokens(input=100_000, output=100_000)  # under every tier threshold
    assert effective.ruleset.prices.cost("gpt-5.5", tokens).usd == pytest.approx(110.0)
    rebuilt = ruleset_from_text(ruleset_text(effective.ruleset))
    assert rebuilt.digest == effective.ruleset.digest
    assert rebuilt.prices.cost("gpt-5.5", tokens).usd == pytest.approx(110.0)
    # the overrides are part of what the rule set means: another price is another digest
    config.write_text(OVERRIDE.replace("100.0", "90.0"))
    assert load_effective(rules, config).ruleset.digest != effective.ruleset.digest


def test_a_rule_set_without_overrides_records_the_same_text_as_before(tmp_path, data_home):
    rules, config = files(tmp_path, "[defaults]\nowner_grant = true\n")
    assert '"prices"' not in ruleset_text(load_effective(rules, config).ruleset)


def test_a_spoiled_imported_table_is_a_one_line_error_at_start_and_a_rejection_on_reload(tmp_path, data_home):
    rules, config = files(tmp_path, OVERRIDE)
    good = load_effective(rules, config)
    data_home.write_text('{"models": {"gpt-5.5": {"input": -1}}}')
    with pytest.raises(RuleSetError) as caught:
        load_effective(rules, config)
    assert str(caught.value).startswith(str(data_home)) and "\n" not in str(caught.value)
    shown = CliRunner().invoke(main, ["rules", "show", "--rules", str(rules), "--config", str(config)])
    assert shown.exit_code == 2 and shown.output.startswith("Error: " + str(data_home)), shown.output
    reloader = RuleReloader(rules, config, good)
    reloader.poll(0.0)
    config.write_text(OVERRIDE + "\n")  # a change, so the reloader reads the files again
    (rejected,) = [e.event for e in reloader.poll(1.0).envelopes]
    assert isinstance(rejected, ev.RulesetRejected) and rejected.error.startswith(str(data_home))
    assert reloader.effective == good


def test_validate_takes_a_config_holding_only_prices(tmp_path):
    assert check_file(OVERRIDE, "c.toml")["kind"] == "config"
    config = tmp_path / "config.toml"
    config.write_text(OVERRIDE)
    checked = CliRunner().invoke(main, ["rules", "validate", str(config)])
    assert checked.exit_code == 0 and "valid config file" in checked.output and "1 price overrides" in checked.output
    config.write_text('[prices."gpt-5.5"]\ninput = "1"\n')
    refused = CliRunner().invoke(main, ["rules", "validate", str(config)])
    assert refused.exit_code == 2 and f'{config}:2: prices."gpt-5.5" field input' in refused.output, refused.output
