"""``tillerman rules …`` through the real command line: exact outputs and exit codes."""

from __future__ import annotations

import json
import os
import pwd
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from fixtures.rule_texts import ANN_STEERS, NO_OWNER_GRANT, grant, notify, reviewer, rule
from tests.installs import give_to_other_user
from tillerman.controller.cli.main import main
from tillerman.ledger import events as ev
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.rules.config import load_effective
from tillerman.rules.files import load_rules
from tillerman.rules.owner import local_login

ROOT = Path(__file__).resolve().parents[2]
DIS = ROOT / "fixtures" / "disagreement"
NOBODY = pwd.getpwnam("nobody")

PROPOSAL = rule(
    "quiet-steer", status="proposed", review_by="2027-06-01", condition={"kind": "turn_quiet", "for": "5m"},
    action="steer", text="Turn {turn_id} has been quiet for {quiet_for}: say what you are waiting for, or change approach.",
    ack_deadline="2m")


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TILLERMAN_LEDGER", str(tmp_path / "ledger.sqlite3"))
    (tmp_path / "proposal.toml").write_text(PROPOSAL)
    return tmp_path


def run(*args):
    result = CliRunner().invoke(main, ["rules", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


def test_validate_a_rule_file(here):
    digest = "sha256:74de0cc6feabd67f3927f8a0ddb61e41846b513427cab1a79c06c366c58a20a6"
    assert run("validate", "proposal.toml") == (
        0, f"proposal.toml: valid rule file: 1 rules (1 proposed), digest {digest}\n", "")
    code, out, _ = run("validate", "proposal.toml", "--json")
    assert code == 0 and json.loads(out) == {"file": "proposal.toml", "valid": True, "kind": "rules", "rules": 1,
                                             "statuses": {"proposed": 1}, "digest": digest}


def test_validate_a_config_file(here):
    (here / "config.toml").write_text(ANN_STEERS + "\n[patterns]\ncritical = ['deploy']\n")
    assert run("validate", "config.toml") == (
        0, "config.toml: valid config file: 1 grants, built-in owner grant on, patterns 1 critical, 7 external\n", "")
    (here / "config.toml").write_text(NO_OWNER_GRANT)
    assert run("validate", "config.toml") == (
        0, "config.toml: valid config file: 0 grants, built-in owner grant off, patterns 7 critical, 7 external\n", "")
    code, out, _ = run("validate", "config.toml", "--json")
    assert json.loads(out) == {"file": "config.toml", "valid": True, "kind": "config", "grants": 0,
                               "owner_grant": False, "reviewers": 0, "notify": 0, "prices": 0,
                               "patterns": {"critical": 7, "external": 7}}


def test_validate_a_config_file_with_reviewers(here):
    (here / "config.toml").write_text(reviewer("codex", ["codex", "exec", "--json", "-"]))
    assert run("validate", "config.toml") == (
        0, "config.toml: valid config file: 0 grants, built-in owner grant on, patterns 7 critical, 7 external,"
           " 1 reviewers\n", "")


def test_validate_a_config_file_with_notify_sinks(here):
    (here / "config.toml").write_text(notify("pager", command=["notify-send", "tillerman"]))
    assert run("validate", "config.toml") == (
        0, "config.toml: valid config file: 0 grants, built-in owner grant on, patterns 7 critical, 7 external,"
           " 1 notify sinks\n", "")


def test_validate_a_wrong_type_under_defaults(here):
    (here / "config.toml").write_text(ANN_STEERS + "\n[defaults]\nowner_grant = 'off'\n")
    assert run("validate", "config.toml") == (2, "", 'Error: config.toml:6: defaults field owner_grant: must be true '
                                                     'or false (got "off"); write it like owner_grant = false\n')


@pytest.mark.parametrize(("change", "error"), [
    (('"steer"', '"reboot"'), 'bad.toml:8: rule "quiet-steer" field action: unknown action "reboot"; expected one of '
     "observe, observe_critical, reconcile, reconcile_turn, report_overdue, steer, queue, interrupt, stop, verify_effect, "
     "expire, escalate"),
    (('for = "5m"', 'for = "5 minutes"'), 'bad.toml:7: rule "quiet-steer" field condition.for: invalid duration '
     '"5 minutes"; write a number and a unit, like 90s, 5m, 1.5h, 1h30m or 250ms'),
    (("version = 1", 'version = "1"'), 'bad.toml:3: rule "quiet-steer" field version: input should be a valid '
     'integer (got "1"); write it like version = 1'),
    (("owner =", "team ="), 'bad.toml:1: rule "quiet-steer" field owner: missing; add owner = "platform-team"\n'
     'bad.toml:5: rule "quiet-steer" field team: unknown field; expected one of id, version, '
     "status, owner, review_by, expires, threads, condition, action, text, ack_deadline, verify, review, task_class"),
    (('status = "proposed"', "status = proposed"), "bad.toml:4: invalid TOML: Invalid value at column 10; strings need "
     'quotes, e.g. status = "active"'),
])
def test_validate_refuses_with_the_line_and_exit_2(here, change, error):
    (here / "bad.toml").write_text(PROPOSAL.replace(*change))
    assert run("validate", "bad.toml") == (2, "", f"Error: {error}\n")
    code, out, _ = run("validate", "bad.toml", "--json")
    assert code == 2 and json.loads(out) == {"file": "bad.toml", "valid": False, "errors": error.splitlines()}


def test_show_the_effective_set(here):
    (here / "rules.toml").write_text(PROPOSAL.replace('"proposed"', '"shadow"').replace("2027-06-01", "2026-01-01")
                                     + "expires = 2027-01-01\n")
    (here / "config.toml").write_text(grant("rule:quiet-steer", ["steer"]) + "\n[patterns]\ncritical = ['\\bdeploy\\b']\n"
                                      "external = []\n\n" + NO_OWNER_GRANT)
    code, out, err = run("show", "--rules", "rules.toml", "--config", "config.toml", "--now", "2026-06-01T00:00:00Z")
    digest = json.loads(run("show", "--rules", "rules.toml", "--config", "config.toml", "--json")[1])["digest"]
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[:4] == [
        f"rule set {digest}",
        "rules: rules.toml; config: config.toml",
        "ID           VERSION  STATUS  ACTION  CONDITION                            OWNER          REVIEW_BY   EXPIRES     WARNING",
        "quiet-steer  1        shadow  steer   { kind = \"turn_quiet\", for = \"5m\" }  platform-team  2026-01-01  2027-01-01  review_overdue 2026-01-01",
    ]
    assert lines[5:9] == ["SUBJECT           ACTIONS  THREADS  SOURCE", "rule:quiet-steer  steer    *        config", "",
                          lines[8]]
    assert lines[8].startswith("patterns (config, sha256:") and lines[9:] == ["  critical  \\bdeploy\\b"]
    code, out, _ = run("show", "--rules", "rules.toml", "--config", "config.toml", "--now", "2027-02-01T00:00:00Z",
                       "--json")
    data = json.loads(out)
    assert data["rules"][0]["warning"] == "expired 2027-01-01"
    assert data["patterns"]["critical"] == ["\\bdeploy\\b"] and data["patterns"]["external"] == []
    assert data["grants"] == [{"subject": "rule:quiet-steer", "actions": ["steer"], "threads": "*", "source": "config"}]
    assert (data["config_path"], data["config_source"]) == ("config.toml", "option")


BUILTIN_GRANT = {"subject": f"owner:{local_login()}", "actions": ["queue", "steer"], "threads": "*",
                 "source": "built-in"}


def test_show_defaults(here):
    code, out, _ = run("show", "--json")
    data = json.loads(out)
    assert code == 0 and data["digest"] == load_effective(None, None).ruleset.digest
    assert data["grants"] == [BUILTIN_GRANT]
    default = here / "config" / "tillerman" / "config.toml"  # $XDG_CONFIG_HOME, set for every test
    assert (data["config_path"], data["config_source"], data["default_config_path"]) == (None, "none", str(default))
    assert [r["id"] for r in data["rules"]] == ["approval-wait", "overdue-intent", "quiet-critical-tool",
                                               "repeated-failure", "stall"]
    assert data["patterns"]["source"] == "built-in" and len(data["patterns"]["critical"]) == 7


def test_show_without_a_config_file_marks_the_builtin_grant(here):
    code, out, _ = run("show")
    lines = out.splitlines()
    default = here / "config" / "tillerman" / "config.toml"
    assert code == 0 and lines[1] == f"rules: built-in defaults; config: none ({default} does not exist)"
    at = next(i for i, line in enumerate(lines) if line.startswith("SUBJECT"))
    assert lines[at].split() == ["SUBJECT", "ACTIONS", "THREADS", "SOURCE"]
    assert lines[at + 1].split() == [f"owner:{local_login()}", "queue,steer", "*", "built-in"]
    assert lines[at + 2] == ("(built-in: the local owner may steer and queue anywhere;"
                             " [defaults] owner_grant = false removes it)")


def test_show_reads_the_default_config_file(here):
    default = here / "config" / "tillerman" / "config.toml"
    default.parent.mkdir(parents=True)
    default.write_text(grant("rule:stall", ["queue"]))
    code, out, _ = run("show", "--json")
    data = json.loads(out)
    assert code == 0 and (data["config_path"], data["config_source"]) == (str(default), "default")
    assert data["grants"] == [BUILTIN_GRANT, {"subject": "rule:stall", "actions": ["queue"], "threads": "*",
                                              "source": "config"}]
    assert data["digest"] == load_effective(None, default).ruleset.digest != load_effective(None, None).ruleset.digest
    assert run("show")[1].splitlines()[1] == f"rules: built-in defaults; config: {default} (the default file)"


def test_owner_grant_false_in_the_default_file_leaves_no_grants(here):
    default = here / "config" / "tillerman" / "config.toml"
    default.parent.mkdir(parents=True)
    default.write_text(NO_OWNER_GRANT)
    code, out, _ = run("show", "--json")
    data = json.loads(out)
    assert code == 0 and data["grants"] == [] and data["config_source"] == "default"
    assert data["digest"] != load_effective(None, None).ruleset.digest  # authority changed, so did the digest
    assert "no grants: nothing may be dispatched" in run("show")[1]


def test_an_explicit_config_wins_over_the_default_file(here):
    default = here / "config" / "tillerman" / "config.toml"
    default.parent.mkdir(parents=True)
    default.write_text("this is not TOML\n")
    (here / "mine.toml").write_text(NO_OWNER_GRANT)
    code, out, _ = run("show", "--config", "mine.toml", "--json")
    assert code == 0 and json.loads(out)["config_path"] == "mine.toml"


def test_an_explicit_config_that_does_not_exist_is_an_error(here):
    code, _, err = run("show", "--config", "missing.toml")
    assert code == 2 and "missing.toml" in err and "does not exist" in err


@pytest.mark.parametrize("command", [
    ["rules", "show"],
    ["rules", "diff", "--against", str(DIS / "candidate.toml"), str(DIS)],
    ["replay", str(DIS)],
    # a ledger that cannot be opened: were the config not read, run would fail there, not run on
    ["run", "--watch", ".", "--ledger", "not-a-directory/ledger.sqlite3"],
])
def test_every_command_with_config_reads_the_default_file(here, command):
    """An invalid default file stops each command with its file:line, before anything runs."""
    (here / "not-a-directory").write_text("")
    default = here / "config" / "tillerman" / "config.toml"
    default.parent.mkdir(parents=True)
    default.write_text("# tillerman\n[defaults]\nowner_grant = 1\n")
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2
    assert result.stderr == (f"Error: {default}:3: defaults field owner_grant: must be true or false (got 1); "
                             "write it like owner_grant = false\n")


def test_diff_finds_the_false_intervention_and_the_catch(here):
    code, out, err = run("diff", "--against", DIS / "candidate.toml", "--config", DIS / "grants.toml", DIS)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    active = load_effective(None, DIS / "grants.toml").ruleset.digest  # the defaults with the fixture's grants
    assert lines[0] == f"active     {active}  (built-in defaults)"
    assert lines[1].startswith("candidate  sha256:") and lines[1].endswith(f"({DIS / 'candidate.toml'})")
    assert lines[2] == ("2 inputs: 2 acts by the active set, 4 by the candidate; 2 agree, 2 disagree "
                        "(0 only active, 2 only candidate, 0 changed)")
    assert lines[4].split() == ["RULE", "KIND", "FILE", "THREAD", "TURN", "AT", "ACTIVE", "CANDIDATE"]
    assert lines[5].split() == [
        "quiet-steer", "only_candidate", "healthy/rollout-2026-10-20T09-00-00-0199b000-0000-7000-8000-00000000cc01.jsonl",
        "0199b000-0000-7000-8000-00000000cc01", "0199b000-0000-7000-8000-0000000000h1", "2026-10-20T09:05:05Z",
        "-", "steer", "(observe", "replayed_would_steer)"]
    assert lines[6].split()[2] == "stuck/rollout-2026-10-21T14-00-00-0199b000-0000-7000-8000-00000000dd01.jsonl"
    assert lines[6].split()[5] == "2026-10-21T14:07:10.900Z"  # five quiet minutes after the third failure

    code, out, _ = run("diff", "--against", DIS / "candidate.toml", "--config", DIS / "grants.toml", DIS, "--json")
    data = json.loads(out)
    assert code == 0
    assert {k: data[k] for k in ("agreements", "only_active", "only_candidate", "changed", "acts", "by_rule")} == {
        "agreements": 2, "only_active": 0, "only_candidate": 2, "changed": 0,
        "acts": {"active": 2, "candidate": 4},
        "by_rule": {"quiet-steer": {"only_active": 0, "only_candidate": 2, "changed": 0}}}
    healthy, stuck = data["disagreements"]
    assert healthy["active"] is None and healthy["candidate"]["summary"] == "steer (observe replayed_would_steer)"
    assert stuck["turn"] == "0199b000-0000-7000-8000-0000000000s1"


def test_diff_sees_a_quiet_critical_build_as_healthy(here):
    """With cargo build configured as critical, the quiet build is left alone: only the catch remains."""
    (here / "config.toml").write_text((DIS / "grants.toml").read_text() + "\n[patterns]\ncritical = ['\\bcargo\\s+build\\b']\n")
    code, out, _ = run("diff", "--against", DIS / "candidate.toml", "--config", "config.toml", DIS, "--json")
    (only,) = json.loads(out)["disagreements"]
    assert code == 0 and "stuck/" in only["file"]


def test_diff_over_a_ledger_and_without_input(here):
    ledger = here / "replayed.sqlite3"
    assert CliRunner().invoke(main, ["replay", "--ledger", str(ledger), str(DIS / "stuck")]).exit_code == 0
    code, out, _ = run("diff", "--against", DIS / "candidate.toml", "--ledger", ledger, "--json")
    assert code == 0 and [d["rule_id"] for d in json.loads(out)["disagreements"]] == ["quiet-steer"]
    assert run("diff", "--against", DIS / "candidate.toml") == (
        2, "", "Error: give the input: --ledger PATH, or recorded session files or directories (not both)\n")
    code, out, _ = run("diff", "--against", DIS / "candidate.toml", DIS / "stuck", "--json")
    assert json.loads(out)["disagreements"][0]["candidate"]["decision"] == "escalate no_grant"


def test_propose_and_promote(here):
    digest = "sha256:ef73d07229d990cf868af8eeb975e15138a5843bcd198c96cf0cb65dff6bd9cc"
    assert run("propose", "proposal.toml", "--evidence", "ledger:seq:17", "--signature", "same test 3x, then quiet",
               "--by", "model") == (0, (
        f"proposed quiet-steer v1 (steer) {digest}\n"
        "evidence: ledger:seq:17; signature: same test 3x, then quiet\n"
        "next: tillerman rules diff --against proposal.toml …, then tillerman rules promote quiet-steer --to shadow\n"),
        "")
    assert run("propose", "proposal.toml") == (0, f"rule quiet-steer v1 is already proposed (proposed, {digest})\n", "")
    assert run("promote", "quiet-steer", "--to", "active", "--by", "ann", "--evaluation", "e",
               "--rollback-trigger", "r") == (1, "", (
        "Error: rule quiet-steer is proposed: it cannot go to active (allowed: shadow); promote it to shadow "
        "first and judge it with tillerman rules diff\n"))
    shutil.copy(ROOT / "rules" / "defaults.toml", here / "rules.toml")
    assert run("promote", "quiet-steer", "--to", "shadow", "--by", "ann", "--evaluation", "diff: 1 catch, 1 false",
               "--rollback-trigger", "a steer on a healthy build", "--rules", "rules.toml") == (0, (
        f"promoted quiet-steer v1 proposed -> shadow by ann ({digest})\n"
        "labeled record: none: no finding or intent of it is on record\n"
        "installed in rules.toml; a running daemon reloads it and records the new digest\n"), "")
    installed = {r.id: r for r in load_rules((here / "rules.toml").read_text(), "rules.toml")}
    assert installed["quiet-steer"].status == "shadow" and len(installed) == 6
    code, out, _ = run("promote", "quiet-steer", "--to", "active", "--by", "bo", "--evaluation", "shadow week: 0 false",
                       "--rollback-trigger", "any false steer", "--rules", "rules.toml", "--json")
    life = json.loads(out)
    assert code == 0 and life["status"] == "active" and life["rule_digest"] == digest
    assert [(p["from_status"], p["to_status"], p["by"], p["evaluation"], p["rollback_trigger"])
            for p in life["promotions"]] == [
        ("proposed", "shadow", "ann", "diff: 1 catch, 1 false", "a steer on a healthy build"),
        ("shadow", "active", "bo", "shadow week: 0 false", "any false steer")]
    assert life["evidence"] == ["ledger:seq:17"] and life["signature"] == "same test 3x, then quiet"
    assert {r.id: r.status for r in load_rules((here / "rules.toml").read_text(), "x")}["quiet-steer"] == "active"
    with SQLiteRecorder(here / "ledger.sqlite3") as rec:
        kinds = [ev.kind_of(e.envelope.event) for e in rec.read()]
    assert kinds == ["rule_proposed", "rule_promoted", "rule_promoted"]
    code, out, _ = run("proposals")
    assert code == 0 and out.splitlines()[1].split()[:6] == ["quiet-steer", "1", "active", "steer", "model", "2"]


def test_a_proposal_chooses_registered_actions_only_and_says_proposed(here):
    (here / "bad.toml").write_text(PROPOSAL.replace('"steer"', '"run_shell"'))
    code, _, err = run("propose", "bad.toml")
    assert code == 2 and 'field action: unknown action "run_shell"' in err
    (here / "active.toml").write_text(PROPOSAL.replace('"proposed"', '"active"'))
    assert run("propose", "active.toml") == (2, "", (
        'Error: active.toml: rule "quiet-steer" field status: a proposal must say status = "proposed" (got "active"); '
        "promotion to shadow or active is tillerman rules promote\n"))
    (here / "grant.toml").write_text(PROPOSAL + "\n" + grant("rule:quiet-steer", ["steer"]))
    code, _, err = run("propose", "grant.toml")
    assert code == 2 and "top level field grant: unknown field; expected one of rule" in err
    assert not (here / "ledger.sqlite3").exists() or not list(SQLiteRecorder(here / "ledger.sqlite3").read())


def test_a_promotion_that_would_break_the_rule_file_writes_and_records_nothing(here):
    run("propose", "proposal.toml")
    run("promote", "quiet-steer", "--to", "shadow", "--by", "a", "--evaluation", "e", "--rollback-trigger", "r")
    (here / "rules.toml").write_text('[[rule]]\nid = "x"\n')
    code, _, err = run("promote", "quiet-steer", "--to", "active", "--by", "a", "--evaluation", "e",
                       "--rollback-trigger", "r", "--rules", "rules.toml")
    assert code == 2 and "the rule file would not validate with the rule installed; nothing written" in err
    assert (here / "rules.toml").read_text() == '[[rule]]\nid = "x"\n'
    assert sorted(p.name for p in here.iterdir() if p.name.startswith(".")) == []
    assert json.loads(run("proposals", "--json")[1])[0]["status"] == "shadow"


def test_propose_by_defaults_to_the_login_name_not_user(here, monkeypatch):
    monkeypatch.delenv("USER", raising=False)
    code, out, _ = run("propose", "proposal.toml", "--json")
    assert code == 0 and json.loads(out)["proposed_by"] == local_login()


# -- files others could write, and paths that are not files ----------------------------------


def tillerman(*args, cwd, timeout=60):
    """The real command in its own process, bounded: what hangs or eats memory fails the
    test instead of the machine."""
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # noqa: E731
    return subprocess.run([sys.executable, "-m", "tillerman.controller", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=limit,
                          env={**os.environ, "XDG_CONFIG_HOME": str(cwd), "PYTHONPATH": str(ROOT)})


def test_run_refuses_rule_and_config_files_others_could_have_written(here):
    (here / "rules.toml").write_text(PROPOSAL.replace('"proposed"', '"active"') + 'verify = "id > pwned"\n')
    (here / "rules.toml").chmod(0o666)
    (here / "sessions").mkdir()
    done = tillerman("run", "--no-codex", "--watch", "sessions", "--rules", "rules.toml", cwd=here)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("Error: rules.toml: writable by group and others (mode 0666): tillerman run refuses it,"
                           " since its commands would run as you; fix: chmod go-w rules.toml\n")
    (here / "rules.toml").chmod(0o644)
    (here / "config.toml").write_text(ANN_STEERS)
    give_to_other_user(here / "config.toml")
    done = tillerman("run", "--no-codex", "--watch", "sessions", "--rules", "rules.toml", "--config", "config.toml",
                     cwd=here)
    assert done.returncode == 2 and done.stderr.startswith("Error: config.toml: owned by nobody, not by you")
    assert not (here / "pwned").exists()


def test_reading_commands_warn_about_files_others_could_have_written(here):
    (here / "proposal.toml").chmod(0o664)
    warning = ("warning: proposal.toml: writable by group (mode 0664): tillerman run refuses it, since its commands"
               " would run as you; fix: chmod go-w proposal.toml\n")
    code, out, err = run("validate", "proposal.toml")
    assert (code, err) == (0, warning) and "valid rule file" in out
    code, _, err = run("show", "--rules", "proposal.toml")
    assert (code, err) == (0, warning)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_validate_of_a_fifo_or_a_device_is_one_line_at_once(here, kind):
    path = here / "rules.toml"
    if kind == "fifo":
        os.mkfifo(path)
        what = "a FIFO (named pipe)"
    else:
        path.symlink_to("/dev/zero")
        what = "a character device"
    done = tillerman("rules", "validate", "rules.toml", cwd=here, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"Error: rules.toml: {what}, not a regular file; give the path of a rule or config file\n")


def test_promote_keeps_the_rule_file_mode_owner_and_symlink(here):
    run("propose", "proposal.toml")
    real = here / "dotfiles" / "rules.toml"
    real.parent.mkdir()
    shutil.copy(ROOT / "rules" / "defaults.toml", real)
    real.chmod(0o600)
    give_to_other_user(real)
    (here / "rules.toml").symlink_to(real)
    code, _, err = run("promote", "quiet-steer", "--to", "shadow", "--by", "ann", "--evaluation", "e",
                       "--rollback-trigger", "r", "--rules", "rules.toml")
    assert code == 0 and err.startswith("warning: rules.toml: owned by nobody")  # as it was before the promotion
    assert (here / "rules.toml").is_symlink()
    st = os.stat(real)
    assert (oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid) == ("0o600", NOBODY.pw_uid, NOBODY.pw_gid)
    assert {r.id: r.status for r in load_rules(real.read_text(), "x")}["quiet-steer"] == "shadow"
    assert sorted(p.name for p in real.parent.iterdir()) == ["rules.toml"]  # nothing staged is left behind


@pytest.mark.parametrize(("content", "says"), [
    ("x = " + "9" * 5000 + "\n", "cannot install the rule (Exceeds the limit (4300 digits)"),
    ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "cannot install the rule (maximum recursion depth exceeded"),
])
def test_promote_into_a_hostile_rule_file_is_one_line_and_writes_nothing(here, content, says):
    run("propose", "proposal.toml")
    (here / "rules.toml").write_text(content)
    code, out, err = run("promote", "quiet-steer", "--to", "shadow", "--by", "a", "--evaluation", "e",
                         "--rollback-trigger", "r", "--rules", "rules.toml")
    assert (code, out) == (2, "") and err.startswith(f"Error: rules.toml: {says}") and len(err.splitlines()) == 1
    assert (here / "rules.toml").read_text() == content
    assert json.loads(run("proposals", "--json")[1])[0]["status"] == "proposed"


def test_the_rules_commands_do_not_import_the_main_command_module():
    """No import circle: both command modules build on ``cli_shared``; ``cli`` adds ``rules``."""
    import subprocess
    import sys

    probe = "import sys, tillerman.controller.cli.rules; print('tillerman.controller.cli.main' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_show_lists_the_reviewers_and_a_rules_review(here):
    (here / "config.toml").write_text(reviewer("codex", ["codex", "exec", "--json", "-"], timeout="90s"))
    (here / "rules.toml").write_text(rule("quiet", condition={"kind": "turn_quiet", "for": "10m"}, action="steer",
                                          text="Read src/ first.", review="codex"))
    code, out, _ = run("show", "--rules", "rules.toml", "--config", "config.toml", "--json")
    data = json.loads(out)
    assert code == 0 and data["rules"][0]["review"] == "codex"
    assert data["reviewers"] == [{"name": "codex", "command": ["codex", "exec", "--json", "-"], "timeout": "1m30s",
                                  "adapter": None, "max_per_intent": 2, "max_per_thread_per_hour": 6,
                                  "budget_usd_per_day": None}]
    code, out, _ = run("show", "--rules", "rules.toml", "--config", "config.toml")
    assert "reviewer codex: codex exec --json - (timeout 1m30s, 2 per intent, 6 per thread per hour)" in out


def test_show_gives_a_reviewers_daily_budget(here):
    (here / "config.toml").write_text(reviewer("claude", ["claude", "-p"], budget_usd_per_day=2.5))
    code, out, _ = run("show", "--config", "config.toml", "--json")
    assert code == 0 and json.loads(out)["reviewers"][0]["budget_usd_per_day"] == 2.5
    code, out, _ = run("show", "--config", "config.toml")
    assert "reviewer claude: claude -p (timeout 1m, 2 per intent, 6 per thread per hour, 2.5 USD a day)" in out


def test_diff_over_a_ledger_shows_each_rules_labeled_record(here):
    ledger = here / "replayed.sqlite3"
    assert CliRunner().invoke(main, ["replay", "--ledger", str(ledger), str(DIS / "stuck")]).exit_code == 0
    with SQLiteRecorder(ledger) as rec:
        (finding,) = [e.envelope.event_id for e in rec.history(kinds=("report",))]
        (intent,) = [e.envelope.event.intent.id for e in rec.history(kinds=("intent_proposed",))]
    for subject, verdict in ((f"finding:{finding}", "useful"), (intent, "not_useful")):
        assert CliRunner().invoke(main, ["label", subject, verdict, "--ledger", str(ledger)]).exit_code == 0
    code, out, _ = run("diff", "--against", DIS / "candidate.toml", "--ledger", ledger, "--json")
    records = json.loads(out)["labeled_records"]
    assert code == 0
    assert {rule: (r["precision"]["value"], r["labeled"], r["unlabeled"]) for rule, r in records.items()} == {
        "repeated-failure": (0.0, 1, 0), "stall": (1.0, 1, 0)}
    code, out, _ = run("diff", "--against", DIS / "candidate.toml", "--ledger", ledger)
    assert code == 0 and "labeled record (tillerman label) of the rules in either set:" in out
    assert "  stall: precision 1.0 (the rule's findings and intents the owner labeled useful / labeled: 1/1);" \
           " 1 labeled (useful 1), 0 unlabeled" in out


def test_promote_shows_the_labeled_record_and_a_label_grants_no_promotion(here):
    assert run("propose", "proposal.toml")[0] == 0
    with SQLiteRecorder(here / "ledger.sqlite3") as rec:
        rec.append([ev.Envelope(event_id=f"f{n}", source="rules", at=float(n), event=ev.Report(
            thread_id="T1", turn_id="U1", rule_id="quiet-steer", rule_version=1, finding=f"quiet {n}",
            detail={"shadow": True})) for n in (1, 2, 3)])
    for finding in ("f1", "f2"):
        assert CliRunner().invoke(main, ["label", f"finding:{finding}", "useful"]).exit_code == 0
    # every labeled finding useful, and still: proposed cannot go to active
    code, _, err = run("promote", "quiet-steer", "--to", "active", "--by", "ann", "--evaluation", "e",
                       "--rollback-trigger", "r")
    assert code == 1 and "cannot go to active" in err
    code, out, _ = run("promote", "quiet-steer", "--to", "shadow", "--by", "ann", "--evaluation", "e",
                       "--rollback-trigger", "r", "--json")
    record = json.loads(out)["labeled_record"]
    assert code == 0 and (record["precision"]["value"], record["labeled"], record["unlabeled"]) == (1.0, 2, 1)
    code, out, _ = run("promote", "quiet-steer", "--to", "active", "--by", "ann", "--evaluation", "e",
                       "--rollback-trigger", "r")
    assert code == 0 and "labeled record: precision 1.0" in out and "2 labeled (useful 2), 1 unlabeled" in out
