"""What the agent's side can record to attack whoever reads it: strings for a terminal
and for an HTML page, and a session that carries one such string in every recorded
field a reader shows (thread and turn ids, the working directory, tool names,
commands, statuses, what started a turn, a Codex goal's status and who changed it,
approvals, queue entries, messages, reports and rule ids, decisions, and the intent's
own fields, reasons and evidence)."""

from __future__ import annotations

from tillerman.controller.core.intent_requests import evidence_envelope, proposal_envelopes, transition_envelope
from tillerman.ledger import events as ev
from tillerman.ledger.events import Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent, text_digest
from tillerman.ledger.projections import Projection

#: A line a newline in a recorded id would forge: it must never start a line of output.
FORGED = "FORGED open intents: 0, overdue: 0"

#: Escape sequences a terminal obeys, and a forged line.
TERMINAL = {
    "clipboard": "\x1b]52;c;cm0gLXJmIH4K\x07",  # OSC 52: the clipboard now holds `rm -rf ~`
    "clear": "\x1b[2J\x1b[H",  # clear the screen, cursor home
    "title": "\x1b]0;owned\x07",  # the window title
    "forged": f"\n{FORGED}",
    "c1": "\x9b2J",  # CSI as one C1 character: a screen clear where 8-bit controls are taken
    "bidi": "\u202ecod.exe\u202c",  # reads backwards from the override on
    "carriage": "\rhidden",
    "nul": "a\x00b\x7f",
}

#: Strings that would end, comment out or re-open the page's script if embedded raw.
HTML = {
    "comment-script": "<!--<script>",
    "end-script": "</script><script>window.pwned = 1</script>",
    "script": "<script>window.pwned = 1</script>",
    "comment-end": "-->",
    "cdata-end": "]]>",
    "separators": "a\u2028b\u2029c",
    "onerror": '<img src=x onerror="window.pwned = 1">',
    "svg": "<svg onload=window.pwned=1>",
    "entity": "&lt;script&gt;&amp;",
    "quote": "\"'`\\",
}


def hostile_session(strings: dict[str, str], at: float = 1_700_000_000.0) -> list[Envelope]:
    """One thread per string, named with it; the string in every field a reader shows.
    Each thread has a turn with a tool call, an approval and a queue entry, a stall
    report, a decision, a rejected intent and an intent left proposed past its deadline."""
    out: list[Envelope] = []
    for n, (name, s) in enumerate(strings.items()):
        out += _thread(f"{name}{n}", s, at + 100 * n)
    return out


def _thread(name: str, s: str, at: float) -> list[Envelope]:
    thread, turn, item = f"thread-{s}", f"turn-{s}", f"call-{s}"

    def env(key: str, event: ev.Event, offset: float) -> Envelope:
        return Envelope(event_id=f"{name}:{key}", event=event, source=f"appserver:{s}", at=at + offset)

    out = [
        env("thread", ev.ThreadStarted(thread_id=thread, cwd=f"/home/{s}", originator=s, cli_version=s), 0),
        env("goal", ev.GoalUpdated(thread_id=thread, status=f"goal-{s}", by=s, origin=s, objective_digest=s), 0.5),
        env("turn", ev.TurnStarted(thread_id=thread, turn_id=turn, trigger=f"trigger-{s}"), 1),
        env("status", ev.StatusChanged(thread_id=thread, status=f"active{s}", flags=(s,)), 1),
        env("call", ev.ItemStarted(thread_id=thread, turn_id=turn, item_id=item, item_type=f"command{s}",
                                   tool=f"bash {s}", critical=True), 2),
        env("approval", ev.ApprovalRequested(thread_id=thread, turn_id=turn, item_id=item, approval_kind=s), 2),
        env("approved", ev.ApprovalResolved(thread_id=thread, turn_id=turn, item_id=item, decision=s), 3),
        env("done", ev.ItemCompleted(thread_id=thread, turn_id=turn, item_id=item, item_type=f"command{s}",
                                     status=s, tool=f"bash {s}"), 4),
        env("queue", ev.QueueChanged(thread_id=thread, turn_id=turn, entries=(ev.QueueEntry(id=f"queued-{s}"),)), 4),
        env("message", ev.AgentMessage(thread_id=thread, turn_id=turn, digest="d", size=len(s), text=s), 5),
        env("stall", ev.Report(thread_id=thread, turn_id=turn, rule_id=f"rule-{s}", rule_version=1,
                               finding=f"turn x made no progress for 600s {s}", detail={"why": s}), 6),
        env("proposed-rule", ev.RuleProposed(rule_id=f"rule-{s}", rule_version=1, rule_digest=s, action="report",
                                             rule=s, evidence=(s,), proposed_by=s, source_path=f"/tmp/{s}.toml"), 6),
    ]
    rejected = _intent(f"in-rejected-{s}", thread, turn, s, at + 7)
    waiting = _intent(f"in-waiting-{s}", thread, turn, s, at + 8)
    out += proposal_envelopes(rejected, Projection())
    out.append(env("decision", ev.DecisionRecorded(thread_id=thread, turn_id=turn, intent_id=rejected.id,
                                                   action="reject", reason=s, rule_id=f"rule-{s}"), 7))
    out.append(transition_envelope(rejected, State.PROPOSED, State.REJECTED, "invalid", {f"key-{s}": s}, at + 7))
    out.append(evidence_envelope(rejected, State.REJECTED, f"reason-{s}", {"said": s}, "late", at + 7))
    out += proposal_envelopes(waiting, Projection())
    out.append(env("held", ev.DecisionRecorded(thread_id=thread, turn_id=turn, intent_id=waiting.id,
                                               action="hold", reason=f"held-{s}"), 8))
    out.append(env("end", ev.TurnCompleted(thread_id=thread, turn_id=turn), 9))
    return out


def _intent(intent_id: str, thread: str, turn: str, s: str, at: float) -> Intent:
    text = f"Stop.{s}"
    return Intent(id=intent_id, thread_id=thread, mode="steer", text=text, text_digest=text_digest(text),
                  created_at=at, ack_deadline=at + 1, expires_at=at + 10_000_000, expected_turn_id=turn,
                  owner=f"ann{s}", producer=f"owner:{s}", rule_id=f"rule-{s}", expect=s, verify=s,
                  task_class=f"class-{s}")
