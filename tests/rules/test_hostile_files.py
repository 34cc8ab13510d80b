"""Rule and config files that someone else could have written, or that are not files
at all: refused (or, when asked, reported) with one line naming the file and the fix."""

from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path

import pytest

from fixtures.rule_texts import ANN_STEERS, rule
from tests.installs import give_to_other_user
from tillerman.rules.config import load_effective
from tillerman.rules.durations import parse_duration
from tillerman.rules.errors import RuleSetError
from tillerman.rules.file_safety import MAX_FILE_BYTES

CONFIG = ANN_STEERS


def check_rule(quiet: str) -> str:
    return rule("check", condition={"kind": "turn_quiet", "for": quiet}, action="report_overdue", verify="true")


def rules_file(directory: Path, text: str = check_rule("10m"), mode: int = 0o644) -> Path:
    path = directory / "rules.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def refusal(rules: Path | None = None, config: Path | None = None) -> str:
    with pytest.raises(RuleSetError) as caught:
        load_effective(rules, config)
    return str(caught.value)


# -- item: files others could have written -----------------------------------------------


@pytest.mark.parametrize(("mode", "writers"), [(0o666, "group and others"), (0o620, "group"), (0o602, "others")])
def test_a_rule_file_others_can_write_is_refused(tmp_path, mode, writers):
    path = rules_file(tmp_path, mode=mode)
    assert refusal(path) == (f"{path}: writable by {writers} (mode {mode:04o}): tillerman run refuses it, since its"
                             f" commands would run as you; fix: chmod go-w {path}")


def test_a_config_owned_by_another_user_is_refused(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    give_to_other_user(path)
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert refusal(config=path) == (f"{path}: owned by nobody, not by you ({me}) or root: tillerman run refuses it,"
                                    f" since its commands would run as you; fix: chown {me} {path}")


def test_a_file_in_a_directory_others_can_write_is_refused_unless_it_is_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    path = rules_file(shared)
    shared.chmod(0o777)
    assert refusal(path) == (f"{path}: its directory {shared} is writable by group and others (mode 0777): tillerman"
                             f" run refuses it, since its commands would run as you; fix: chmod go-w {shared}")
    shared.chmod(0o1777)  # like /tmp: only the file's owner may replace it
    assert load_effective(path, None).ruleset.rules[0].verify == "true"


def test_a_symlinked_file_is_judged_by_the_file_and_both_directories(tmp_path):
    real, links = tmp_path / "real", tmp_path / "links"
    real.mkdir()
    links.mkdir()
    target = rules_file(real)
    link = links / "rules.toml"
    link.symlink_to(target)
    assert load_effective(link, None).ruleset.rules
    target.chmod(0o646)
    assert refusal(link).startswith(f"{link}: writable by others (mode 0646)")
    target.chmod(0o644)
    real.chmod(0o757)
    assert refusal(link).startswith(f"{link}: its directory {real} is writable by others (mode 0757)")


def test_when_asked_an_unsafe_file_is_reported_and_read(tmp_path):
    path = rules_file(tmp_path, mode=0o666)
    told: list[str] = []
    effective = load_effective(path, None, on_unsafe=told.append)
    assert [rule.id for rule in effective.ruleset.rules] == ["check"]
    assert told == [f"{path}: writable by group and others (mode 0666): tillerman run refuses it, since its commands"
                    f" would run as you; fix: chmod go-w {path}"]


# -- item: files that are not files, or too large, or too deep ----------------------------


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "rules.toml"
    os.mkfifo(fifo, 0o600)
    # a reader that waits for a writer would hang the test: one comes, late, to end the wait
    late_writer = threading.Timer(5, lambda: os.close(os.open(fifo, os.O_WRONLY)))
    late_writer.daemon = True
    late_writer.start()
    try:
        assert refusal(fifo) == f"{fifo}: a FIFO (named pipe), not a regular file; give the path of a rule or config file"
    finally:
        late_writer.cancel()


def test_a_symlink_to_a_device_is_refused_without_reading_it(tmp_path):
    link = tmp_path / "config.toml"
    link.symlink_to("/dev/zero")
    assert refusal(config=link) == (f"{link}: a character device, not a regular file; give the path of a rule or"
                                    " config file")


def test_a_directory_is_refused(tmp_path):
    assert refusal(tmp_path) == f"{tmp_path}: a directory, not a regular file; give the path of a rule or config file"


def test_a_file_over_the_size_limit_is_refused(tmp_path):
    path = rules_file(tmp_path, check_rule("10m") + "#" * MAX_FILE_BYTES)
    assert refusal(path) == (f"{path}: larger than 1 MiB, the most a rule or config file may hold; check the path"
                             " given")
    path.write_text(check_rule("10m").ljust(MAX_FILE_BYTES, "#"))  # the limit itself is fine
    assert load_effective(path, None).ruleset.rules


@pytest.mark.parametrize("nested", ["x = " + "[" * 100_000 + "]" * 100_000, "x = " + "{a = " * 5000 + "1" + "}" * 5000])
def test_nesting_too_deep_for_the_parser_is_a_line_error(tmp_path, nested):
    path = rules_file(tmp_path, check_rule("10m") + "\n" + nested + "\n")
    assert refusal(path) == (f"{path}:11: invalid TOML: arrays or tables nested too deeply; rule and config files"
                             " need a few levels at most")


@pytest.mark.parametrize("text", ["9" * 400 + "s", "99999999999d", "367d", "8785h", "31622401s"])
def test_a_duration_beyond_a_year_is_refused(text):
    with pytest.raises(ValueError, match=r"is too long; at most 366d$"):
        parse_duration(text)


def test_the_longest_duration_is_a_leap_year():
    assert parse_duration("366d") == parse_duration("8784h") == 366 * 86400.0


def test_an_overflowing_duration_in_a_file_is_a_line_error(tmp_path):
    path = rules_file(tmp_path, check_rule("9" * 400 + "s"))
    assert refusal(path) == (f'{path}:7: rule "check" field condition.for: duration "{"9" * 59}…'
                             " is too long; at most 366d")


def test_thousands_of_wrong_entries_give_the_first_twenty_and_a_count(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[[grant]]\nsubject = 5\nactions = [\"steer\"]\n" * 1000)
    lines = refusal(config=path).splitlines()
    assert len(lines) == 21
    assert lines[0] == f"{path}:2: grant #1 field subject: input should be a valid string (got 5); write it like subject = \"owner:NAME\""
    assert lines[-1] == f"{path}:59: and 980 more problems; fix these first"
