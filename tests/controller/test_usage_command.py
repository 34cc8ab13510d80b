"""``tillerman usage``: the account by day, session, model and turn, from folders and from
a ledger, with its filters, its JSON shape, its costs and its errors."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tillerman.controller.cli.main import main
from tillerman.ledger.usage import Tokens
from tillerman.rules.prices import bundled_table

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = ROOT / "fixtures" / "sessions"
THREAD = "0199b000-0000-7000-8000-0000000000d1"
FIGURES = ("input", "cached_input", "cache_write", "cache_write_1h", "output", "reasoning", "total")
ROW_FIELDS = {*FIGURES, "cost_usd", "cost_missing", "first_activity", "last_activity", "models"}


@pytest.fixture(autouse=True)
def _own_prices(tmp_path, monkeypatch):
    """The bundled price table, whatever the machine's user imported or configured."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("TILLERMAN_LEDGER", raising=False)


def _write(path: Path, lines: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
    return path


def _codex_figures(inp: int, cached: int, out: int, reasoning: int = 0) -> dict:
    return {"input_tokens": inp, "cached_input_tokens": cached, "output_tokens": out,
            "reasoning_output_tokens": reasoning, "total_tokens": inp + out}


def _rollout(folder: Path) -> Path:
    """A Codex thread of two turns: one response on 2026-12-01 at 23:30 UTC, one the next day."""
    first, second = _codex_figures(1000, 400, 50, 10), _codex_figures(2000, 1500, 70)
    total = {k: first[k] + second[k] for k in first}
    return _write(folder / "sessions" / "2026" / "12" / "01" / f"rollout-2026-12-01T23-00-00-{THREAD}.jsonl", [
        {"timestamp": "2026-12-01T23:00:00Z", "type": "session_meta", "payload": {"id": THREAD}},
        {"timestamp": "2026-12-01T23:00:01Z", "type": "turn_context", "payload": {"turn_id": "t1", "model": "gpt-5"}},
        {"timestamp": "2026-12-01T23:30:00Z", "type": "event_msg",
         "payload": {"type": "token_count", "info": {"total_token_usage": first, "last_token_usage": first}}},
        {"timestamp": "2026-12-02T09:00:00Z", "type": "turn_context", "payload": {"turn_id": "t2", "model": "gpt-5"}},
        {"timestamp": "2026-12-02T09:00:05Z", "type": "event_msg",
         "payload": {"type": "token_count", "info": {"total_token_usage": total, "last_token_usage": second}}},
    ])


def _assistant(session: str, n: int, usage: dict, *, model: str = "claude-sonnet-4-5", stamp: str,
               message: str | None = None, **kw) -> dict:
    return {"type": "assistant", "sessionId": session, "uuid": f"{session}-a{n}", "timestamp": stamp,
            "requestId": f"req-{message or n}",
            "message": {"id": f"msg-{message or n}", "model": model, "usage": usage, "role": "assistant",
                        "content": [{"type": "text", "text": "done"}]}, **kw}


def _transcript(folder: Path, session: str = "c-1") -> Path:
    """A Claude Code session on 2026-12-02: a response written twice (one count), one of a
    model with no price."""
    usage = {"input_tokens": 10, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 40,
             "output_tokens": 25}
    return _write(folder / "projects" / "-work-app" / f"{session}.jsonl", [
        {"type": "user", "sessionId": session, "uuid": f"{session}-u1", "timestamp": "2026-12-02T10:00:00Z",
         "message": {"role": "user", "content": "fix it"}},
        _assistant(session, 1, usage, stamp="2026-12-02T10:00:01Z"),
        _assistant(session, 2, usage, stamp="2026-12-02T10:00:02Z", message="1"),  # the same response again
        _assistant(session, 3, {"input_tokens": 5, "output_tokens": 5}, model="house-model-7",
                   stamp="2026-12-02T10:00:03Z"),
    ])


@pytest.fixture()
def folders(tmp_path) -> list[str]:
    codex, claude = tmp_path / "codex", tmp_path / "claude"
    _rollout(codex)
    _transcript(claude)
    return [str(codex / "sessions"), str(claude / "projects")]


def usage(*args: str, code: int = 0) -> dict | str:
    result = CliRunner().invoke(main, ["usage", *args])
    assert result.exit_code == code, result.output
    return json.loads(result.output) if "--json" in args and code == 0 else result.output


def test_the_collector_is_as_it_was_after_a_report(folders):
    """The command relaxes the garbage collector while it reads and folds (its objects
    live until it ends), and leaves the process's collector as it found it, on failure too."""
    before = (gc.get_threshold(), gc.get_freeze_count())
    usage(*folders, "--json")
    usage(*folders, str(folders[0]) + "-gone", code=2)  # a missing path, found once reading starts
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


def _cost(model: str, tokens: Tokens) -> float:
    cost = bundled_table().cost(model, tokens)
    assert cost.usd is not None
    return cost.usd


GPT_1 = Tokens(input=1000, cached_input=400, output=50, reasoning=10)
GPT_2 = Tokens(input=2000, cached_input=1500, output=70)
SONNET = Tokens(input=350, cached_input=300, cache_write=40, output=25)
HOUSE = Tokens(input=5, output=5)


def test_by_day_in_utc(folders):
    shown = usage(*folders, "--timezone", "UTC", "--json")
    assert [row["day"] for row in shown["rows"]] == ["2026-12-01", "2026-12-02"]
    first, second = shown["rows"]
    assert first["input"] == 1000 and first["cached_input"] == 400 and first["reasoning"] == 10
    assert first["cost_usd"] == pytest.approx(_cost("gpt-5", GPT_1), abs=1e-12)
    # The next day: the second Codex response and the Claude session (its repeated entry counted once).
    assert second["input"] == 2000 + 350 + 5 and second["output"] == 70 + 25 + 5
    assert second["models"] == ["claude-sonnet-4-5", "gpt-5", "house-model-7"]
    # One response with no price: the row has no cost, with the reason, never 0.
    assert second["cost_usd"] is None
    assert second["cost_missing"] == [{"model": "house-model-7", "reason": "no_price"}]
    assert shown["totals"]["total"] == sum(t.total for t in (GPT_1, GPT_2, SONNET, HOUSE))


def test_days_are_counted_in_the_zone_given(folders):
    # 23:30 UTC on 12-01 is 08:30 on 12-02 in Tokyo: the whole account falls on one day.
    shown = usage(*folders, "--timezone", "Asia/Tokyo", "--json")
    assert [row["day"] for row in shown["rows"]] == ["2026-12-02"]
    assert shown["timezone"] == "Asia/Tokyo"


def test_since_and_until_keep_the_responses_of_those_days(folders):
    shown = usage(*folders, "--timezone", "UTC", "--since", "2026-12-02", "--json")
    assert [row["day"] for row in shown["rows"]] == ["2026-12-02"]
    assert shown["totals"]["input"] == 2000 + 350 + 5
    shown = usage(*folders, "--timezone", "UTC", "--until", "20261201", "--json")  # ccusage's form too
    assert [row["day"] for row in shown["rows"]] == ["2026-12-01"]
    assert (shown["since"], shown["until"]) == (None, "2026-12-01")
    assert usage(*folders, "--timezone", "UTC", "--since", "2026-12-03", "--json")["rows"] == []


def test_by_session_names_the_thread_its_agent_and_files(folders):
    shown = usage(*folders, "--by", "session", "--json")
    sessions = {row["session"]: row for row in shown["rows"]}
    assert set(sessions) == {THREAD, "c-1"}
    assert sessions[THREAD]["source"] == "codex" and sessions["c-1"]["source"] == "claude"
    assert [Path(f).name for f in sessions[THREAD]["files"]] == [f"rollout-2026-12-01T23-00-00-{THREAD}.jsonl"]
    assert sessions[THREAD]["cost_usd"] == pytest.approx(_cost("gpt-5", GPT_1) + _cost("gpt-5", GPT_2), abs=1e-12)
    assert sessions[THREAD]["first_activity"] == "2026-12-01T23:30:00Z"
    assert sessions[THREAD]["last_activity"] == "2026-12-02T09:00:05Z"
    assert sessions["c-1"]["input"] == 355 and sessions["c-1"]["cost_usd"] is None


def test_by_session_says_how_full_each_context_was_at_its_last_response(folders):
    """The rollout names no window, so the price table's for the last response's model is
    taken; the transcript's last response is of a model with no window anywhere."""
    sessions = {row["session"]: row for row in usage(*folders, "--by", "session", "--json")["rows"]}
    window = bundled_table().context_window("gpt-5")
    assert window
    assert (sessions[THREAD]["last_input"], sessions[THREAD]["context_window"]) == (GPT_2.input, window)
    assert sessions[THREAD]["context_use"] == pytest.approx(GPT_2.input / window)
    assert (sessions["c-1"]["last_input"], sessions["c-1"]["context_window"], sessions["c-1"]["context_use"]) == (
        HOUSE.input, None, None)


def test_cost_is_summed_response_by_response(folders):
    # Priced one response at a time (a tier is decided per response), not on the sum.
    shown = usage(*folders, "--by", "model", "--json")
    models = {row["model"]: row for row in shown["rows"]}
    assert list(models) == ["claude-sonnet-4-5", "gpt-5", "house-model-7"]
    assert models["gpt-5"]["cost_usd"] == pytest.approx(_cost("gpt-5", GPT_1) + _cost("gpt-5", GPT_2), abs=1e-12)
    assert models["claude-sonnet-4-5"]["cost_usd"] == pytest.approx(_cost("claude-sonnet-4-5", SONNET), abs=1e-12)
    assert models["claude-sonnet-4-5"]["cache_write"] == 40


def test_by_turn(folders):
    shown = usage(*folders, "--by", "turn", "--json")
    turns = [(row["session"], row["turn"], row["total"]) for row in shown["rows"]]
    assert turns == [(THREAD, "t1", GPT_1.total), (THREAD, "t2", GPT_2.total),
                     ("c-1", "c-1-u1", SONNET.total + HOUSE.total)]


def test_breakdown_splits_each_row_by_model(folders):
    shown = usage(*folders, "--timezone", "UTC", "--breakdown", "--json")
    parts = {part["model"]: part for part in shown["rows"][1]["breakdown"]}
    assert set(parts) == {"claude-sonnet-4-5", "gpt-5", "house-model-7"}
    assert parts["gpt-5"]["input"] == 2000 and parts["house-model-7"]["cost_usd"] is None
    assert "breakdown" not in usage(*folders, "--json")["rows"][0]


def test_the_json_shape(folders):
    shown = usage(*folders, "--by", "session", "--json")
    assert set(shown) == {"by", "timezone", "since", "until", "prices", "rows", "totals", "vendor", "mismatches",
                          "quarantined"}
    table = bundled_table()
    assert shown["prices"] == {"date": table.date, "source": table.source, "digest": table.digest}
    assert set(shown["rows"][0]) == ROW_FIELDS | {"session", "source", "files", "last_input", "context_window",
                                                  "context_use"}
    assert set(shown["totals"]) == {*FIGURES, "cost_usd", "cost_missing"}
    assert shown["mismatches"] == [] and shown["quarantined"] == [] and shown["vendor"] == []


def test_a_duplicate_that_wins_later_moves_its_cost(tmp_path):
    """A sidechain copy counted first, then the main thread's entry of the same message:
    the main one wins (ccusage's rule), and the sidechain's figures and cost leave its row."""
    usage_figures = {"input_tokens": 100, "output_tokens": 20}
    _write(tmp_path / "p" / "s-2.jsonl", [
        _assistant("s-2", 1, usage_figures, stamp="2026-12-02T10:00:00Z", message="m", isSidechain=True,
                   agentId="helper"),
        _assistant("s-2", 2, usage_figures, stamp="2026-12-02T10:00:01Z", message="m"),
    ])
    shown = usage(str(tmp_path / "p"), "--by", "session", "--json")
    rows = {row["session"]: row for row in shown["rows"]}
    assert list(rows) == ["s-2"]  # the subagent's thread has nothing left
    assert rows["s-2"]["cost_usd"] == pytest.approx(_cost("claude-sonnet-4-5", Tokens(input=100, output=20)))
    assert shown["totals"]["total"] == 120


def test_hostile_lines_are_listed_and_the_rest_counted(tmp_path):
    path = _write(tmp_path / "p" / "s-3.jsonl", [
        _assistant("s-3", 1, {"input_tokens": -1, "output_tokens": 3}, stamp="2026-12-02T10:00:00Z"),
        _assistant("s-3", 2, {"input_tokens": 1, "output_tokens": "3"}, stamp="2026-12-02T10:00:01Z"),
        _assistant("s-3", 3, {"input_tokens": 4, "output_tokens": 3}, stamp="2026-12-02T10:00:02Z"),
    ])
    shown = usage(str(path), "--json")
    assert shown["totals"]["input"] == 4
    second_line = len(path.read_bytes().split(b"\n")[0]) + 1
    assert shown["quarantined"] == [{"file": str(path), "offset": 0, "reason": "usage_negative"},
                                    {"file": str(path), "offset": second_line, "reason": "usage_not_integer"}]
    text = usage(str(path))
    assert "Quarantined: 2" in text and f"{path} offset 0: usage_negative" in text


def test_text_output_is_a_table_with_totals_and_notes(folders):
    text = usage(*folders, "--timezone", "UTC")
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["DAY", "MODELS", "INPUT"] and lines[0].split()[-1] == "COST"
    assert lines[1].startswith("2026-12-01") and lines[2].startswith("2026-12-02")
    assert lines[2].split()[-1] == "price" and "no price" in lines[2]
    assert lines[3].startswith("Total")
    assert "Prices: table dated" in text and "No price for: house-model-7 (no_price)" in text


def test_a_ledger_written_by_replay_gives_the_same_account(tmp_path):
    sources = [str(SESSIONS / "codex-rollout"), str(SESSIONS / "claude-transcript")]
    ledger = tmp_path / "ledger.sqlite3"
    replayed = CliRunner().invoke(main, ["replay", "--ledger", str(ledger), *sources])
    assert replayed.exit_code == 0, replayed.output
    for by in ("session", "turn"):
        from_files = usage(*sources, "--by", by, "--timezone", "UTC", "--json")
        from_ledger = usage("--ledger", str(ledger), "--by", by, "--timezone", "UTC", "--json")
        # From files, every line the reader refused is listed (it held usage's bytes); a
        # ledger's records refused for other reasons are not usage's to list.
        refused = from_files.pop("quarantined")
        assert from_ledger.pop("quarantined") == [q for q in refused if q["reason"].startswith("usage_")]
        assert refused == [{"file": str(SESSIONS / "codex-rollout" / "bad-lines.jsonl"), "offset": 678,
                            "reason": "not_an_object"}]
        assert from_ledger == from_files
        assert from_files["rows"] and all(row["total"] for row in from_files["rows"])


def test_no_usage_says_so(tmp_path):
    _write(tmp_path / "empty" / "x.jsonl", [{"type": "summary", "sessionId": "s", "summary": "nothing"}])
    assert usage(str(tmp_path / "empty")).startswith("No usage.")


@pytest.mark.parametrize("args, said", [
    (["/nonexistent/folder"], "no such file or folder"),
    (["--since", "2026-13-01"], "--since '2026-13-01' is not a date"),
    (["--until", "yesterday"], "--until 'yesterday' is not a date"),
    (["--timezone", "Mars/Olympus"], "--timezone 'Mars/Olympus' is not a time zone"),
    (["--since", "2026-12-05", "--until", "2026-12-01"], "is after --until"),
])
def test_bad_input_is_one_error_line(folders, args, said):
    given = args if args[0].startswith("/") else [*folders, *args]
    output = usage(*given, code=2)
    assert output.count("\n") == 1 and output.startswith("Error:") and said in output


def test_a_ledger_that_is_not_there_is_not_created(tmp_path):
    ledger = tmp_path / "none.sqlite3"
    output = usage("--ledger", str(ledger), code=2)
    assert "no ledger at" in output and not ledger.exists()


def test_no_ledger_and_no_folders_names_both_ways_in(tmp_path, monkeypatch):
    """A person who runs no daemon has no ledger: the error names the folders too."""
    monkeypatch.delenv("TILLERMAN_LEDGER", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    output = usage(code=2)
    assert output.startswith("Error: no ledger at") and output.count("\n") == 1
    assert "--ledger PATH" in output and "tillerman usage ~/.codex/sessions ~/.claude/projects" in output
    assert not (tmp_path / "state").exists()


def test_a_file_that_is_no_ledger_is_refused(tmp_path):
    bogus = tmp_path / "bogus.sqlite3"
    bogus.write_bytes(b"not a database at all" * 100)
    output = usage("--ledger", str(bogus), code=2)
    assert output.startswith("Error:") and output.count("\n") == 1


def test_a_ledger_and_paths_together_are_refused(folders, tmp_path):
    assert "not both" in usage("--ledger", str(tmp_path / "l.sqlite3"), *folders, code=2)


def test_a_response_of_no_tokens_costs_nothing_whatever_its_model(tmp_path):
    """Claude Code's <synthetic> entries (no model ran) have no price and no tokens: they
    leave the row's cost as it is, where they would otherwise make it null."""
    zero = {"input_tokens": 0, "output_tokens": 0}
    path = _write(tmp_path / "p" / "s-4.jsonl", [
        _assistant("s-4", 1, {"input_tokens": 4, "output_tokens": 3}, stamp="2026-12-02T10:00:00Z"),
        _assistant("s-4", 2, zero, model="<synthetic>", stamp="2026-12-02T10:00:01Z"),
    ])
    shown = usage(str(path), "--json")
    assert shown["totals"]["cost_usd"] == pytest.approx(_cost("claude-sonnet-4-5", Tokens(input=4, output=3)))
    assert shown["totals"]["cost_missing"] == []


def test_progress_is_one_line_rewritten(capsys):
    from tillerman.controller.cli.usage import progress

    for done in range(1, 61):
        progress(done, 60)
    assert capsys.readouterr().err == "\rreading usage: 25/60 files\rreading usage: 50/60 files" \
                                      "\rreading usage: 60/60 files\n"
