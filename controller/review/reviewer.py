"""Asking a configured reviewer: the packet on its stdin, one answer from its stdout.

The I/O edge of ``tillerman.rules.review`` (the contract) and
``tillerman.ledger.reviews`` (what was asked before). ``ask`` runs the command once:

- in a new session, so a timeout kills the whole process group, grandchildren included
  (a reviewer that is a shell script starting a model CLI leaves nothing behind);
- with its own scratch HOME and CODEX_HOME (or the ``home`` configured), and that
  directory as its working directory: a reviewer that is itself a coding agent writes its
  sessions there, never where tillerman watches, so it is never supervised or reviewed;
- for ``codex-exec-json``, with ``INSTRUCTIONS`` before the packet (``codex exec -``
  reads its prompt from stdin) and the answer taken from the final agent message;
- for ``claude-print-json``, the same on stdin (``claude -p`` reads its prompt there) and
  the answer taken from the ``result`` of the one JSON object ``--output-format json``
  prints, with its token usage and ``total_cost_usd``;
- with stdout in a file read up to a bound, so a flood or a grandchild holding the pipe
  cannot block or exhaust tillerman.

Any failure (not started, timeout, a signal, a non-zero exit, no answer, an answer the
contract refuses) is a ``FailedClosed`` outcome: nothing is dispatched on its account.

``run_checkpoint`` adds the ledger records: ``review_pending`` appended durably before
the call, ``review_committed`` after; an id asked before is answered from the ledger.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import msgspec

from tillerman.ledger.events import Envelope, ReviewCommitted, ReviewPending
from tillerman.ledger.recorder import Recorder
from tillerman.ledger.reviews import Call, OverBudget, Plan, Refused, fold_reviews, plan_checkpoint
from tillerman.rules.review import (
    INSTRUCTIONS,
    MAX_ANSWER_BYTES,
    Accepted,
    FailedClosed,
    Outcome,
    PacketRefused,
    Reviewer,
    ReviewPacket,
    digest,
    failed,
    judge_answer,
    packet_json,
)

#: What a ``codex exec --json`` stream may hold: every event of a turn, far more than the answer.
MAX_STREAM_BYTES = 8 * 1024 * 1024
#: A reviewer's scratch home and working directory, under the temporary directory: a thread
#: started there is the reviewer's own (``tillerman.controller.review.checkpoints.is_reviewer_thread``).
SCRATCH_PREFIX = "tillerman-reviewer-"
STDERR_SHOWN = 300


class Asked(msgspec.Struct, frozen=True, kw_only=True):
    """One call and what came of it."""

    outcome: Outcome
    packet_digest: str
    packet_size: int
    called: bool  # False: refused before the call (the packet broke the contract)
    wall_ms: int = 0
    tokens: int | None = None
    cost_usd: float | None = None
    answer: bytes = b""  # the answer as judged (after the adapter)


def ask(reviewer: Reviewer, checkpoint: str, packet: ReviewPacket) -> Asked:
    """Run ``reviewer`` once on ``packet`` and judge its answer for ``checkpoint``."""
    try:
        body = packet_json(packet)
    except PacketRefused as exc:
        body = msgspec.json.encode(packet)
        return Asked(outcome=failed("packet_refused", str(exc)), packet_digest=digest(body),
                     packet_size=len(body), called=False)
    started = time.monotonic()
    prompt = INSTRUCTIONS.encode() + body if reviewer.adapter is not None else body
    run = _run(reviewer, prompt)
    wall_ms = round((time.monotonic() - started) * 1000)
    common = {"packet_digest": digest(body), "packet_size": len(body), "called": True, "wall_ms": wall_ms}
    if isinstance(run, FailedClosed):
        return Asked(outcome=run, **common)
    cost = None
    if reviewer.adapter == "codex-exec-json":
        answer, tokens = codex_exec_answer(run)
    elif reviewer.adapter == "claude-print-json":
        answer, tokens, cost = claude_print_answer(run)
    else:
        answer, tokens = run, None
    if isinstance(answer, FailedClosed):
        return Asked(outcome=answer, tokens=tokens, cost_usd=cost, **common)
    if len(answer) > MAX_ANSWER_BYTES:
        return Asked(outcome=failed("too_long", f"the answer is over {MAX_ANSWER_BYTES} bytes"), tokens=tokens,
                     cost_usd=cost, **common)
    outcome = judge_answer(checkpoint, answer)
    if isinstance(outcome, Accepted):
        tokens = outcome.answer.tokens if outcome.answer.tokens is not None else tokens
        cost = outcome.answer.cost_usd if outcome.answer.cost_usd is not None else cost
        return Asked(outcome=outcome, tokens=tokens, cost_usd=cost, answer=answer, **common)
    return Asked(outcome=outcome, tokens=tokens, cost_usd=cost, answer=answer, **common)


def _run(reviewer: Reviewer, body: bytes) -> bytes | FailedClosed:
    """The command's stdout, or why the call failed."""
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    home = Path(reviewer.home).expanduser() if reviewer.home else scratch
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(home / ".codex")}
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    limit = MAX_STREAM_BYTES if reviewer.adapter is not None else MAX_ANSWER_BYTES
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(reviewer.command, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                        cwd=scratch, env=env, start_new_session=True)
            except OSError as exc:
                return failed("not_started", f"{reviewer.command[0]}: {exc.strerror or exc}")
            timed_out = False
            try:
                _write(proc, body)
                proc.wait(timeout=reviewer.timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)
                proc.wait()
            if timed_out:
                return failed("timeout", f"no answer within {reviewer.timeout:g}s; the process group was killed")
            if proc.returncode < 0:
                return failed("crash", f"killed by signal {-proc.returncode}{_stderr(err)}")
            if proc.returncode != 0:
                return failed("nonzero_exit", f"exit status {proc.returncode}{_stderr(err)}")
            out.seek(0)
            data = out.read(limit + 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if len(data) > limit:
        return failed("too_long", f"the output is over {limit} bytes")
    if not data.strip():
        return failed("no_answer", "the command wrote nothing on stdout")
    return data


def _write(proc: subprocess.Popen, body: bytes) -> None:
    """The packet on stdin (at most 12 KiB and the instructions: it fits the pipe, so
    this does not block)."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(body)
        proc.stdin.close()
    except BrokenPipeError:  # it exited without reading: its exit status says what happened
        pass


def _kill_group(pgid: int) -> None:
    """SIGKILL what is left of the command's process group (grandchildren too)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stderr(err) -> str:
    err.seek(0)
    tail = err.read()[-STDERR_SHOWN:].decode("utf-8", "replace").strip().splitlines()
    return f" ({tail[-1]})" if tail else ""


def codex_exec_answer(stream: bytes) -> tuple[bytes | FailedClosed, int | None]:
    """The answer in a ``codex exec --json`` stream: its last completed agent message,
    with a Markdown code fence around it removed; and the tokens its turns report."""
    message, tokens, failure = None, None, None
    for line in stream.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # not an event: codex prints nothing else on stdout, but a wrapper may
        if not isinstance(record, dict):
            continue
        kind, item = record.get("type"), record.get("item")
        if kind == "item.completed" and isinstance(item, dict) and item.get("type") == "agent_message":
            message = item.get("text")
        elif kind == "turn.completed" and isinstance(record.get("usage"), dict):
            usage = record["usage"]
            counted = [v for k, v in usage.items() if k in ("input_tokens", "output_tokens") and isinstance(v, int)]
            tokens = (tokens or 0) + sum(counted)
        elif kind in ("turn.failed", "error"):
            error = record.get("error") if kind == "turn.failed" else record
            failure = str(error.get("message") if isinstance(error, dict) else error)
    if not isinstance(message, str) or not message.strip():
        why = f"codex exec failed: {failure}" if failure else "no agent message in the codex exec --json output"
        return failed("no_answer", why), tokens
    return _unfenced(message).encode("utf-8"), tokens


def claude_print_answer(output: bytes) -> tuple[bytes | FailedClosed, int | None, float | None]:
    """The answer in what ``claude -p --output-format json`` prints: one ``result``
    object whose ``result`` is the final text (a Markdown fence around it removed); and
    the tokens (``usage``) and cost (``total_cost_usd``) it reports. ``is_error`` (an API
    error, an aborted turn) fails closed whatever the text says."""
    try:
        record = json.loads(output)
    except ValueError as exc:
        return failed("no_answer", f"claude -p --output-format json printed no JSON object ({exc})"), None, None
    if not isinstance(record, dict) or record.get("type") != "result":
        return failed("no_answer", "claude -p --output-format json printed no result object"), None, None
    usage = record.get("usage")
    tokens = sum(v for k, v in usage.items() if k in ("input_tokens", "output_tokens") and isinstance(v, int)) \
        if isinstance(usage, dict) else None
    cost = record.get("total_cost_usd")
    cost = float(cost) if isinstance(cost, int | float) else None
    text = record.get("result")
    if record.get("is_error"):
        why = record.get("terminal_reason") or record.get("subtype") or "error"
        return failed("no_answer", f"claude -p failed ({why}): {str(text or '')[:STDERR_SHOWN]}"), tokens, cost
    if not isinstance(text, str) or not text.strip():
        return failed("no_answer", "the claude -p result is empty"), tokens, cost
    return _unfenced(text).encode("utf-8"), tokens, cost


def _unfenced(text: str) -> str:
    text = text.strip()
    if text.startswith("```") and text.endswith("```") and "\n" in text:
        return text[text.index("\n") + 1: -3].strip()
    return text


# -- with the ledger ---------------------------------------------------------------------------------


def run_checkpoint(ledger: Recorder, reviewer: Reviewer, packet: ReviewPacket, *, now: float,
                   retain_payloads: bool = False) -> Plan | Asked:
    """Ask ``reviewer`` at ``packet``'s checkpoint unless the ledger says not to: a
    recorded answer (``Recorded``), an interrupted or reused id (``Refused``, recorded
    as the checkpoint's outcome), a spent cap (``Escalate``), or a spent budget
    (``OverBudget``, recorded as the checkpoint's outcome)."""
    reviews = fold_reviews(ledger.read())
    where = checkpoint_where(reviewer, packet)
    plan = plan_checkpoint(reviews, checkpoint_id=packet.checkpoint_id, checkpoint=packet.checkpoint,
                           intent_id=packet.intent_id, thread_id=packet.thread_id, now=now,
                           max_per_intent=reviewer.max_per_intent,
                           max_per_thread_per_hour=reviewer.max_per_thread_per_hour,
                           reviewer=reviewer.name, budget_usd_per_day=reviewer.budget_usd_per_day)
    if isinstance(plan, OverBudget) or (isinstance(plan, Refused) and plan.reason == "review_interrupted"):
        append_review(ledger, ReviewCommitted(**where, outcome=plan.reason), now)
    if not isinstance(plan, Call):
        return plan
    append_review(ledger, pending_event(reviewer, packet), now, durable=True)
    asked = ask(reviewer, packet.checkpoint, packet)
    append_review(ledger, committed_event(asked, where, retain_payloads=retain_payloads), time.time())
    return asked


def checkpoint_where(reviewer: Reviewer, packet: ReviewPacket) -> dict:
    """The fields naming one checkpoint, shared by its pending and committed records."""
    return {"checkpoint_id": packet.checkpoint_id, "checkpoint": packet.checkpoint, "reviewer": reviewer.name,
            "intent_id": packet.intent_id, "thread_id": packet.thread_id}


def pending_event(reviewer: Reviewer, packet: ReviewPacket) -> ReviewPending:
    body = msgspec.json.encode(packet)
    return ReviewPending(**checkpoint_where(reviewer, packet), packet_digest=digest(body), packet_size=len(body),
                         probe=packet.probe)


def committed_event(asked: Asked, where: dict, *, retain_payloads: bool) -> ReviewCommitted:
    outcome = asked.outcome
    answer = outcome.answer if isinstance(outcome, Accepted) else None
    return ReviewCommitted(
        **where,
        outcome="accepted" if answer is not None else outcome.reason,
        disposition=answer.disposition if answer else None,
        recommended_action=answer.recommended_action if answer else None,
        corrections=len(answer.required_corrections) if answer else 0,
        answer_digest=outcome.answer_digest,
        wall_ms=asked.wall_ms, tokens=asked.tokens, cost_usd=asked.cost_usd,
        flags=() if answer else outcome.flags,
        answer=asked.answer.decode("utf-8", "replace") if retain_payloads and asked.answer else None,
        text=answer.text if answer else None,
        required=tuple(f"{c.correction} (proof: {c.proof})" for c in answer.required_corrections) if answer else (),
    )


def append_review(ledger: Recorder, event: ReviewPending | ReviewCommitted, at: float, *,
                  durable: bool = False) -> None:
    ledger.append([review_envelope(event, at)], durable=durable)


def review_envelope(event: ReviewPending | ReviewCommitted, at: float) -> Envelope:
    """One review record; its id names the checkpoint, so it is recorded once."""
    kind = event.__struct_config__.tag
    return Envelope(event_id=f"{kind}:{event.checkpoint_id}", event=event, source="tillerman:reviewer",
                    at=at, observed_at=at)
