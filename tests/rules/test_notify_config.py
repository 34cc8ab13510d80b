"""[[notify]] tables in the config file: a command or a loopback (or explicitly allowed)
webhook, validated with line-accurate errors."""

from __future__ import annotations

import pytest

from fixtures.rule_texts import notify
from tillerman.rules.config import check_file, load_effective
from tillerman.rules.errors import RuleSetError
from tillerman.rules.files import load_config
from tillerman.rules.notify import NotifySink


def config_error(text: str) -> str:
    with pytest.raises(RuleSetError) as caught:
        load_config(text, "config.toml")
    return str(caught.value)


def test_a_command_and_a_webhook_become_sinks(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(notify("pager", command=["notify-send", "tillerman"], kinds=["overdue", "report"],
                           group_window="30s", repeat="1h", timeout="5s")
                    + notify("hook", webhook="http://127.0.0.1:9000/tillerman"))
    assert load_effective(None, path).sinks == (
        NotifySink(name="pager", command=("notify-send", "tillerman"), kinds=("overdue", "report"),
                   group_window=30.0, repeat=3600.0, timeout=5.0),
        NotifySink(name="hook", webhook="http://127.0.0.1:9000/tillerman"))
    assert check_file(path.read_text(), str(path))["notify"] == 2


def test_defaults_of_a_sink():
    (sink,) = load_config(notify("n", command=["x"]), "config.toml").sinks()
    assert (sink.group_window, sink.repeat, sink.kinds, sink.timeout) == (
        10.0, None, ("overdue", "escalation", "report", "goal", "usage"), 10.0)


def test_a_remote_webhook_needs_allow_remote():
    text = notify("hook", webhook="https://alerts.example.com/hook")
    assert config_error(text) == (
        'config.toml:3: notify "hook" field webhook: webhook "https://alerts.example.com/hook" is not on this'
        " machine; notices name your threads and intents: add allow_remote = true if that host is meant, or use"
        " a loopback URL")
    allowed = notify("hook", allow_remote=True, webhook="https://alerts.example.com/hook")
    assert load_config(allowed, "config.toml").sinks()[0].webhook == "https://alerts.example.com/hook"


@pytest.mark.parametrize(("keys", "message"), [
    ({}, 'config.toml:1: notify "n" field webhook: missing; add webhook = "http://127.0.0.1:9000/tillerman" or'
         ' command = ["notify-send"]'),
    ({"command": ["x"], "webhook": "http://localhost/"},
     'config.toml:4: notify "n" field webhook: give command or webhook, not both'),
    ({"webhook": "ftp://127.0.0.1/x"}, 'config.toml:3: notify "n" field webhook: invalid webhook "ftp://127.0.0.1/x";'
                                       " write an http:// or https:// URL"),
    ({"command": ["x"], "kinds": ["stall"]},
     'config.toml:4: notify "n" field kinds: unknown kind "stall"; expected one of overdue, escalation, report, goal'),
    ({"command": ["x"], "repeat": "often"}, 'config.toml:4: notify "n" field repeat: invalid duration "often"'),
    ({"command": ["x"], "group_window": "0s"}, 'config.toml:4: notify "n" field group_window: duration "0s" is not'
                                               " positive"),
    ({"command": []}, 'config.toml:3: notify "n" field command:'),
    ({"command": ["x"], "colour": "red"}, 'config.toml:4: notify "n" field colour: unknown field; expected one of'
                                          " name, command, allow_remote, webhook,"),
])
def test_a_wrong_key_is_named_with_its_line(keys, message):
    assert config_error(notify("n", **keys)).startswith(message)


def test_a_sink_name_is_used_once():
    assert config_error(notify("n", command=["x"]) + notify("n", command=["y"])) == (
        'config.toml:5: notify "n" field name: duplicate name, already used at line 2; give each [[notify]]'
        " its own name")
