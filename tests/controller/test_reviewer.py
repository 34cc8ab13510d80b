"""Running a configured reviewer: small Python scripts stand in for a model CLI, one per
way a call can go, and each failure fails the checkpoint closed."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tillerman.controller.review.reviewer import ask, codex_exec_answer, run_checkpoint
from tillerman.ledger.events import ReviewCommitted, ReviewPending
from tillerman.ledger.memory import MemoryRecorder
from tillerman.ledger.reviews import Escalate, Recorded, Refused
from tillerman.rules.review import LEGAL, Accepted, EvidencePointer, FailedClosed, Reviewer, ReviewPacket

QUESTION = "Is the steer to turn T2 the right next step?"
GOOD = {"disposition": "ready_for_existing_gate", "reason": "the evidence supports it", "confidence": 0.7}


def packet(checkpoint_id: str = "before_dispatch:in-1@T2", **overrides) -> ReviewPacket:
    fields = dict(question=QUESTION, question_again=QUESTION, checkpoint="before_dispatch",
                  checkpoint_id=checkpoint_id, thread_id="th-1", intent_id="in-1",
                  intended_outcome="the agent reads src/db before editing", last_verified_result="none",
                  ownership="owner:ann", interventions_allowed=("steer",), dispositions=LEGAL["before_dispatch"],
                  evidence=(EvidencePointer(provenance="ledger", summary="three failed greps", first_seq=4,
                                            last_seq=9),))
    return ReviewPacket(**(fields | overrides))


def script(tmp_path: Path, body: str, name: str = "reviewer.py", **keys) -> Reviewer:
    path = tmp_path / name
    path.write_text("import json, os, sys, time, subprocess\n" + textwrap.dedent(body))
    return Reviewer(name="script", command=(sys.executable, str(path)), **keys)


def answering(tmp_path: Path, answer: dict | str, **keys) -> Reviewer:
    text = answer if isinstance(answer, str) else json.dumps(answer)
    return script(tmp_path, f"packet = json.load(sys.stdin)\nsys.stdout.write({text!r})\n", **keys)


def test_a_good_answer_is_accepted_and_the_packet_reaches_stdin(tmp_path):
    seen = tmp_path / "seen.json"
    reviewer = script(tmp_path, f"""
        packet = sys.stdin.read()
        open({str(seen)!r}, "w").write(packet)
        print(json.dumps({GOOD!r} | {{"tokens": 1200}}))
    """)
    asked = ask(reviewer, "before_dispatch", packet())
    assert isinstance(asked.outcome, Accepted)
    assert asked.called and asked.tokens == 1200 and asked.wall_ms >= 0
    assert json.loads(seen.read_text())["question"] == QUESTION


def test_the_reviewer_runs_in_a_scratch_home(tmp_path):
    reviewer = script(tmp_path, """
        sys.stdin.read()
        home = os.environ["HOME"]
        ok = os.getcwd() == home and os.environ["CODEX_HOME"] == os.path.join(home, ".codex")
        print(json.dumps({"disposition": "hold", "reason": home if ok else "wrong", "confidence": 1}))
    """)
    asked = ask(reviewer, "before_dispatch", packet())
    home = asked.outcome.answer.reason
    assert Path(home).name.startswith("tillerman-reviewer-")
    assert not Path(home).exists()  # removed after the call


@pytest.mark.parametrize(("body", "why"), [
    ("sys.stdin.read(); print('{\"disposition\": ')", "malformed_json"),
    ("sys.stdin.read(); print(json.dumps({'disposition': 'approve', 'reason': 'r', 'confidence': 1}))",
     "verdict_not_disposition"),
    ("sys.stdin.read(); print(json.dumps({'disposition': 'continue_with_directive', 'reason': 'r',"
     " 'confidence': 1, 'recommended_action': 'steer', 'text': 't'}))", "illegal_disposition"),
    ("sys.stdin.read(); print(json.dumps({'disposition': 'hold', 'reason': 'cleared to merge', 'confidence': 1}))",
     "authority_language"),
    ("sys.stdin.read(); sys.exit(3)", "nonzero_exit"),
    ("sys.stdin.read(); os.kill(os.getpid(), 9)", "crash"),
    ("sys.stdin.read()", "no_answer"),
    ("sys.stdin.read(); sys.stdout.write('x' * 70000)", "too_long"),
])
def test_each_failure_fails_closed(tmp_path, body, why):
    asked = ask(script(tmp_path, body), "before_dispatch", packet())
    assert isinstance(asked.outcome, FailedClosed)
    assert asked.outcome.reason == f"review_failed:{why}"


def test_a_command_that_does_not_exist_fails_closed(tmp_path):
    asked = ask(Reviewer(name="gone", command=(str(tmp_path / "no-such-reviewer"),)), "before_dispatch", packet())
    assert asked.outcome.reason == "review_failed:not_started"


def test_a_timeout_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    reviewer = script(tmp_path, f"""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(300)
    """, timeout=1.0)
    asked = ask(reviewer, "before_dispatch", packet())
    assert asked.outcome.reason == "review_failed:timeout"
    grandchild = int(pid_file.read_text())
    for _ in range(100):  # killed at once; reaped by init shortly after
        if not _alive(grandchild):
            break
        time.sleep(0.05)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_an_oversize_packet_is_refused_before_any_call(tmp_path):
    marker = tmp_path / "called"
    reviewer = script(tmp_path, f"open({str(marker)!r}, 'w').write('yes')\n")
    asked = ask(reviewer, "before_dispatch", packet(intended_outcome="x" * 13000))
    assert asked.outcome.reason == "review_failed:packet_refused"
    assert "over the 12288-byte cap" in asked.outcome.detail
    assert not asked.called and not marker.exists()


# -- codex exec --json -----------------------------------------------------------------------------


def stream(*messages: str, usage: dict | None = None) -> bytes:
    lines = [{"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"}]
    lines += [{"type": "item.completed", "item": {"id": f"i{n}", "type": "agent_message", "text": m}}
              for n, m in enumerate(messages)]
    lines.append({"type": "turn.completed", "usage": usage or {"input_tokens": 900, "cached_input_tokens": 100,
                                                              "output_tokens": 50}})
    return "\n".join(json.dumps(line) for line in lines).encode()


def test_the_codex_adapter_takes_the_last_agent_message_and_the_tokens():
    answer, tokens = codex_exec_answer(stream("thinking…", "```json\n" + json.dumps(GOOD) + "\n```"))
    assert json.loads(answer) == GOOD and tokens == 950


def test_the_codex_adapter_without_an_agent_message_fails_closed():
    failure = b'{"type": "turn.failed", "error": {"message": "model unavailable"}}'
    answer, _ = codex_exec_answer(failure)
    assert isinstance(answer, FailedClosed) and "model unavailable" in answer.detail


def test_a_codex_exec_reviewer_through_the_adapter(tmp_path):
    prompt = tmp_path / "prompt.txt"
    reviewer = script(tmp_path, f"""
        open({str(prompt)!r}, "w").write(sys.stdin.read())
        sys.stdout.write({stream(json.dumps(GOOD)).decode()!r})
    """, adapter="codex-exec-json")
    asked = ask(reviewer, "before_dispatch", packet())
    assert isinstance(asked.outcome, Accepted) and asked.tokens == 950
    instructions, body = prompt.read_text().split("Review packet:\n")
    assert "exactly one JSON object" in instructions and json.loads(body)["question"] == QUESTION


# -- with the ledger -------------------------------------------------------------------------------


def test_a_checkpoint_is_recorded_pending_then_committed(tmp_path):
    ledger = MemoryRecorder()
    asked = run_checkpoint(ledger, answering(tmp_path, GOOD), packet(), now=1000.0)
    assert isinstance(asked.outcome, Accepted)
    events = [e.envelope.event for e in ledger.read()]
    assert [type(e) for e in events] == [ReviewPending, ReviewCommitted]
    assert events[0].packet_digest == asked.packet_digest
    assert (events[1].outcome, events[1].disposition, events[1].answer) == ("accepted", "ready_for_existing_gate",
                                                                            None)


def test_a_repeated_checkpoint_returns_the_record_without_a_call(tmp_path):
    ledger, counter = MemoryRecorder(), tmp_path / "calls"
    reviewer = script(tmp_path, f"""
        sys.stdin.read()
        open({str(counter)!r}, "a").write("call\\n")
        print(json.dumps({GOOD!r}))
    """, max_per_intent=1)
    run_checkpoint(ledger, reviewer, packet(), now=1000.0)
    again = run_checkpoint(ledger, reviewer, packet(), now=1001.0)
    assert isinstance(again, Recorded) and again.committed.disposition == "ready_for_existing_gate"
    assert counter.read_text() == "call\n"


def test_pending_without_committed_is_interrupted_and_not_called(tmp_path):
    ledger, counter = MemoryRecorder(), tmp_path / "calls"
    reviewer = script(tmp_path, f"open({str(counter)!r}, 'a').write('call')\n")
    from tillerman.ledger.events import Envelope
    ledger.append([Envelope(event_id="p", source="t", at=1.0, event=ReviewPending(
        checkpoint_id="before_dispatch:in-1@T2", checkpoint="before_dispatch", reviewer="script",
        intent_id="in-1", thread_id="th-1"))])
    found = run_checkpoint(ledger, reviewer, packet(), now=1000.0)
    assert isinstance(found, Refused) and found.reason == "review_interrupted"
    assert not counter.exists()
    last = list(ledger.read())[-1].envelope.event
    assert isinstance(last, ReviewCommitted) and last.outcome == "review_interrupted"


def test_the_cap_escalates_instead_of_calling(tmp_path):
    ledger = MemoryRecorder()
    reviewer = answering(tmp_path, GOOD, max_per_intent=1)
    run_checkpoint(ledger, reviewer, packet(), now=1000.0)
    found = run_checkpoint(ledger, reviewer, packet("review:in-1@T2", checkpoint="review",
                                                    dispositions=LEGAL["review"]), now=1001.0)
    assert isinstance(found, Escalate) and found.reason == "review_capped"


def test_a_failed_call_is_committed_with_its_reason_and_flags(tmp_path):
    ledger = MemoryRecorder()
    run_checkpoint(ledger, answering(tmp_path, GOOD | {"reason": "LGTM"}), packet(), now=1000.0,
                   retain_payloads=True)
    last = list(ledger.read())[-1].envelope.event
    assert (last.outcome, last.flags) == ("review_failed:authority_language", ("authority_language",))
    assert json.loads(last.answer)["reason"] == "LGTM"


def test_sigkill_during_the_call_then_a_restart_makes_no_second_call(tmp_path):
    """The reviewer SIGKILLs tillerman mid-call: the durable review_pending survives, and
    the restarted run fails the checkpoint closed without calling again."""
    import subprocess

    from tillerman.ledger.sqlite import SQLiteRecorder

    ledger_path, calls = tmp_path / "ledger.sqlite3", tmp_path / "calls"
    reviewer_script = tmp_path / "killer.py"
    reviewer_script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        sys.stdin.read()
        open({str(calls)!r}, "a").write("call\\n")
        os.kill(os.getppid(), signal.SIGKILL)
    """))
    run = textwrap.dedent(f"""
        import sys
        from tests.controller.test_reviewer import packet
        from tillerman.controller.review.reviewer import run_checkpoint
        from tillerman.ledger.sqlite import SQLiteRecorder
        from tillerman.rules.review import Reviewer
        reviewer = Reviewer(name="killer", command=(sys.executable, {str(reviewer_script)!r}))
        with SQLiteRecorder({str(ledger_path)!r}) as ledger:
            print(type(run_checkpoint(ledger, reviewer, packet(), now=1000.0)).__name__)
    """)
    root = Path(__file__).resolve().parents[2]
    first = subprocess.run([sys.executable, "-c", run], cwd=root, capture_output=True, text=True, timeout=60)
    assert first.returncode == -9, first.stderr
    second = subprocess.run([sys.executable, "-c", run], cwd=root, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "Refused"
    assert calls.read_text() == "call\n"  # one call, charged once
    with SQLiteRecorder(ledger_path) as ledger:
        kinds = [(type(e.envelope.event).__name__, getattr(e.envelope.event, "outcome", None)) for e in ledger.read()]
    assert kinds == [("ReviewPending", None), ("ReviewCommitted", "review_interrupted")]


def claude_result(text: str, **more) -> dict:
    """The one object ``claude -p --output-format json`` prints (Claude Code 2.1.332)."""
    return {"type": "result", "subtype": "success", "is_error": False, "duration_ms": 1635, "duration_api_ms": 54,
            "num_turns": 1, "result": text, "stop_reason": "end_turn", "session_id": "99582ced-0000",
            "total_cost_usd": 0.000188, "terminal_reason": "completed", "permission_denials": [],
            "usage": {"input_tokens": 1200, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                      "output_tokens": 80, "service_tier": "standard"},
            "uuid": "b97b7c4d-0000", **more}


def fake_claude(tmp_path: Path, printed: dict, status: int = 0) -> Reviewer:
    """A ``claude`` that checks what it was given on stdin and prints ``printed``."""
    return script(tmp_path, f"""
        prompt = sys.stdin.read()
        assert prompt.startswith("You are a reviewer for tillerman"), prompt[:80]
        packet = json.loads(prompt.split("Review packet:\\n", 1)[1])
        assert packet["question"] == packet["question_again"]
        print(json.dumps({printed!r}))
        sys.exit({status})
    """, name="claude", adapter="claude-print-json")


def test_a_claude_print_json_reviewer_through_the_adapter(tmp_path):
    answer = "```json\n" + json.dumps(GOOD) + "\n```"
    asked = ask(fake_claude(tmp_path, claude_result(answer)), "before_dispatch", packet())
    assert isinstance(asked.outcome, Accepted), asked.outcome
    assert asked.outcome.answer.disposition == "ready_for_existing_gate"
    assert (asked.tokens, asked.cost_usd) == (1280, 0.000188)


@pytest.mark.parametrize(("printed", "status", "why"), [
    (claude_result("API Error: 400 fake server: scripted failure", is_error=True, terminal_reason="api_error"), 1,
     "nonzero_exit"),
    (claude_result("slow r", is_error=True, subtype="error_during_execution", terminal_reason="aborted_streaming"),
     0, "no_answer"),
    (claude_result(""), 0, "no_answer"),
    (claude_result("Looks fine to me."), 0, "malformed_json"),
    ({"type": "assistant"}, 0, "no_answer"),
])
def test_a_claude_print_json_failure_fails_closed(tmp_path, printed, status, why):
    asked = ask(fake_claude(tmp_path, printed, status), "before_dispatch", packet())
    assert isinstance(asked.outcome, FailedClosed) and asked.outcome.reason == f"review_failed:{why}"
