"""One Claude Code session seen through several sources at once is one thread with one
set of turns. The recording ``fixtures/sessions/claude-live/hooks`` holds the same
session (the real CLI 2.1.332) three ways: its transcript, its hook spool and its
stream-json stdout. The transcript names a turn by the uuid of the message that opened
it, as stdout does, and carries its ``promptId``, the hooks' ``prompt_id``: folded
together in any order, the turns are the five the session had, each found under every
id, none ``unclosed``."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from tests.monitor.support import SESSIONS, parse
from tillerman.controller.claude import wrapper as claude_wrapper
from tillerman.controller.report.fold import Facts
from tillerman.ledger.events import Entry, Envelope, TurnAlias, TurnCompleted, TurnStarted
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent, text_digest
from tillerman.ledger.projections import Projection
from tillerman.ledger.snapshot import ENDED_TURN_STATES
from tillerman.monitor.tailer import file_source
from tillerman.rules.policy import decide
from tillerman.rules.ruleset import Grant, build_ruleset

RECORDED = SESSIONS / "claude-live" / "hooks"
FILES = {"transcript": ("claude-transcript", "transcript.jsonl"), "hooks": ("claude-hooks", "hooks.jsonl"),
         "stdout": ("claude-stream-json", "stdout.jsonl")}
#: How the CLI's own ``result`` lines (and the hooks' Stop / StopFailure) ended the five turns.
ENDED = ["completed", "completed", "completed", "interrupted", "failed"]


def envelopes(name: str) -> list[Envelope]:
    fmt, file = FILES[name]
    source = file_source(RECORDED / file)
    parsed, _ = parse(fmt, (RECORDED / file).read_bytes(), source=source)
    return [Envelope(event_id=f"{name}-{i}", event=p.event, source=source, at=p.at) for i, p in enumerate(parsed)]


def turn_ids(name: str) -> list[str]:
    return [e.event.turn_id for e in envelopes(name) if isinstance(e.event, TurnStarted)]


def fold(*streams: list[Envelope], by_turn: bool) -> Projection:
    """The sources folded one after another (``by_turn`` False: each wholly before the
    next, as when one file is read late), or turn by turn (each source's events up to
    its next turn start, in turn)."""
    projection = Projection()
    for seq, env in enumerate(interleaved(streams, by_turn), 1):
        projection.apply_envelope(env, seq)
    return projection


def interleaved(streams: tuple[list[Envelope], ...], by_turn: bool) -> list[Envelope]:
    if not by_turn:
        return [e for stream in streams for e in stream]
    turns = itertools.zip_longest(*map(_by_turn, streams), fillvalue=[])
    return [e for chunks in turns for e in itertools.chain(*chunks)]


def _by_turn(stream: list[Envelope]) -> list[list[Envelope]]:
    chunks: list[list[Envelope]] = [[]]
    for env in stream:
        if isinstance(env.event, TurnStarted):
            chunks.append([])
        chunks[-1].append(env)
    return chunks


def test_the_recording_has_the_five_turns_under_two_ids() -> None:
    """The premise: stdout and the transcript share their ids, the hooks' are others."""
    assert turn_ids("transcript") == turn_ids("stdout")
    assert len(turn_ids("hooks")) == 5 and not set(turn_ids("hooks")) & set(turn_ids("transcript"))
    assert [e.event.status for e in envelopes("stdout") if isinstance(e.event, TurnCompleted)] == ENDED


@pytest.mark.parametrize("by_turn", [False, True], ids=["file-after-file", "turn-by-turn"])
@pytest.mark.parametrize("names", [("transcript", "hooks"), ("hooks", "transcript"), ("transcript", "stdout"),
                                   ("stdout", "transcript"), ("hooks", "transcript", "stdout"),
                                   ("stdout", "hooks", "transcript")], ids="+".join)
def test_sources_of_one_session_fold_into_one_set_of_turns(names: tuple[str, ...], by_turn: bool) -> None:
    thread = fold(*map(envelopes, names), by_turn=by_turn).threads[envelopes("hooks")[0].event.thread_id]
    assert len(thread.turn_states) == 5, thread.turn_states
    assert "unclosed" not in thread.turn_states.values()
    for name in names:  # every source's id finds its turn
        assert [thread.turn_state(t) for t in turn_ids(name)] == ENDED
    assert thread.active_turn_id is None and not thread.running


@pytest.mark.parametrize("by_turn", [False, True], ids=["file-after-file", "turn-by-turn"])
def test_the_report_counts_each_turn_once(by_turn: bool) -> None:
    """``tillerman report`` and the timeline read turns through the same fold."""
    streams = (envelopes("hooks"), envelopes("transcript"))
    facts = Facts().fold(Entry(seq=seq, envelope=env, prev_hash="", hash="")
                         for seq, env in enumerate(interleaved(streams, by_turn), 1))
    assert [turn.status for turn in facts.turns.values()] == ENDED


# -- the wrapper's link, recorded after both starts --------------------------------------

WRAPPER = "claude-wrapper:run-1"


def wrapper_envelopes() -> list[Envelope]:
    """The session's stdout as ``tillerman claude`` records it, under its own source."""
    return [msgspec.structs.replace(e, source=WRAPPER) for e in envelopes("stdout")]


def late_links(first: str) -> list[tuple[list[Envelope], list[Envelope]]]:
    """Per turn, as the real CLI 2.1.332 orders it live (test_claude_hooks_and_wrapper_live):
    both sources' starts (``first``'s before the other's), then the wrapper's link (the
    transcript's prompt line is written after stdout's ``system/init``), then the rest:
    (up to the link, from it on)."""
    aliases = claude_wrapper.transcript_aliases(RECORDED / "transcript.jsonl")
    turns = []
    for hooks, stdout in itertools.zip_longest(_by_turn(envelopes("hooks")), _by_turn(wrapper_envelopes()),
                                               fillvalue=[]):
        if not (hooks and stdout and isinstance(stdout[0].event, TurnStarted)):
            turns.append((hooks + stdout, []))
            continue
        start = stdout[0].event
        link = Envelope(event_id=f"link-{start.turn_id}", source=WRAPPER, at=stdout[0].at,
                        event=TurnAlias(thread_id=start.thread_id, turn_id=start.turn_id, alias=aliases[start.turn_id]))
        starts = [hooks[0], stdout[0]] if first == "hooks" else [stdout[0], hooks[0]]
        turns.append((starts, [link, *hooks[1:], *stdout[1:]]))
    return turns


@pytest.mark.parametrize("first", ["hooks", "wrapper"])
def test_no_verdict_rests_on_one_source_while_the_wrappers_link_is_on_its_way(first: str) -> None:
    """Between the second source's start and the link, the first source's turn is not
    ended: a steer expecting it (under either id) is not expired ``turn_ended``, nor a
    claim in it settled ``not_delivered``. After the link, one turn; the report counts
    each turn once. On the code before, the first start read as ``unclosed`` in that
    window, and the report had ten turns, five of them never ended."""
    projection, facts, seq = Projection(), Facts(), 0
    ruleset = build_ruleset((), (Grant(subject="owner:ann", actions=frozenset({"steer"})),))
    for before, after in late_links(first):
        for envelope in before:
            seq += 1
            projection.apply_envelope(envelope, seq)
            facts.apply(Entry(seq=seq, envelope=envelope, prev_hash="", hash=""))
        if after:
            superseded = before[0].event.turn_id
            snapshot = projection.snapshot(before[0].event.thread_id)
            assert snapshot.turn_state(superseded) not in ENDED_TURN_STATES
            steer = Intent(id=f"in-{seq:020d}", thread_id=snapshot.thread_id, mode="steer", text="t",
                           text_digest=text_digest("t"), created_at=0.0, ack_deadline=1e10, expires_at=1e10,
                           expected_turn_id=superseded, owner="ann", producer="owner:ann")
            assert decide(steer, State.PROPOSED, snapshot, 1.0, ruleset).reason != "turn_ended"
        for envelope in after:
            seq += 1
            projection.apply_envelope(envelope, seq)
            facts.apply(Entry(seq=seq, envelope=envelope, prev_hash="", hash=""))
    thread = projection.threads[envelopes("hooks")[0].event.thread_id]
    assert list(thread.turn_states.values()) == ENDED
    assert [turn.status for turn in facts.turns.values()] == ENDED
