"""``tillerman claude`` without a CLI: the command it runs, the transcript readback on
transcripts the real CLI 2.1.332 wrote, and who carries out a wrapped session's intents."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.controller.test_claude_relay import INJECT_TURN, INJECTED, LATER, LATER_TURN, RECORDED
from tests.monitor.support import SESSIONS, parse
from tillerman.controller.claude import wrapper as claude_wrapper
from tillerman.controller.claude.wrapper import (
    CLAUDE_BIN_ENV,
    WrapperError,
    claude_command,
    resumed_session,
    transcript_turns,
)
from tillerman.controller.core import intent_requests
from tillerman.controller.core.delivery import Delivery
from tillerman.controller.core.facts import Tick
from tillerman.controller.core.reconcile import observed
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger import events as ev
from tillerman.ledger import projections
from tillerman.ledger.changes import ChangeFeed
from tillerman.ledger.errors import OperationalError
from tillerman.ledger.events import Envelope
from tillerman.ledger.intent_states import State
from tillerman.ledger.intents import Intent
from tillerman.ledger.projections import Projection
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.codex_wire import IN_PROGRESS
from tillerman.monitor.lines import MAX_LINE
from tillerman.monitor.tailer import file_source
from tillerman.rules.ruleset import Grant, build_ruleset

ROOT = Path(__file__).resolve().parents[2]


def test_the_stream_json_flags_are_added_only_when_the_harness_did_not_give_them(monkeypatch):
    monkeypatch.setenv(CLAUDE_BIN_ENV, "/opt/claude")
    assert claude_command(["--resume", "s1"]) == ["/opt/claude", "--input-format", "stream-json", "--output-format",
                                                  "stream-json", "--verbose", "--resume", "s1"]
    given = ["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]
    assert claude_command(given) == ["/opt/claude", *given]
    assert resumed_session(["--verbose", "--resume", "s1"]) == "s1" == resumed_session(["--resume=s1"])
    assert resumed_session(["-p"]) is None


def test_without_a_cli_the_error_says_what_to_do(monkeypatch):
    monkeypatch.delenv(CLAUDE_BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(WrapperError, match="claude is not on PATH; install Claude Code or set TILLERMAN_CLAUDE_BIN"):
        claude_command([])


def test_the_transcript_shows_a_folded_steer_in_its_turn_and_a_queued_message_as_its_own_turn():
    folded = transcript_turns(RECORDED / "inject" / "transcript.jsonl", INJECTED, "tillerman-in-1")
    assert [(t.id, t.status, [i.client_id for i in t.items]) for t in folded.turns] == [
        (INJECT_TURN, "completed", ["tillerman-in-1"])]
    later = transcript_turns(RECORDED / "later" / "transcript.jsonl", LATER, "tillerman-in-2")
    assert [(t.id, bool(t.items)) for t in later.turns] == [(LATER, True), (LATER_TURN, False)]  # newest first
    absent = transcript_turns(RECORDED / "inject" / "transcript.jsonl", LATER, "tillerman-in-3")
    assert not [t for t in absent.turns if t.items] and IN_PROGRESS not in {t.status for t in absent.turns}


def driven(daemon: Daemon, intent_id: str) -> list[tuple]:
    """The delivery tasks the daemon starts for one fact of this intent."""
    started: list[tuple] = []

    class Group:
        def start_soon(self, *args):
            started.append(args)

    daemon._drive(Group(), intent_id, Tick(time.time()))
    return started


def test_the_daemon_leaves_a_wrapped_session_s_intents_to_the_wrapper(tmp_path):
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        recorder.append([Envelope(event_id="w1", event=ev.TurnStarted(thread_id="S", turn_id="T"),
                                  source="claude-wrapper:run1", at=time.time())])
        intent = intent_requests.propose(recorder, thread_id="S", mode="steer", text="x", expected_turn="T",
                                         owner="ann")
        projection = projections.load(recorder)
        assert projection.snapshot("S").steerable and projection.threads["S"].wrapped
        daemon = Daemon(recorder, build_ruleset((), (Grant(subject="owner:ann", actions=frozenset({"steer"})),)),
                        DaemonOptions(watch=(str(tmp_path),)))
        daemon.projection = projection
        assert driven(daemon, intent.id) == []


def test_an_app_server_thread_is_still_driven_by_the_daemon(tmp_path):
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        recorder.append([Envelope(event_id="a1", event=ev.TurnStarted(thread_id="S", turn_id="T"),
                                  source="appserver:x", at=time.time())])
        intent = intent_requests.propose(recorder, thread_id="S", mode="steer", text="x", expected_turn="T",
                                         owner="ann")
        daemon = Daemon(recorder, build_ruleset((), ()), DaemonOptions(watch=(str(tmp_path),)))
        daemon.projection = projections.load(recorder)
        assert not daemon.projection.threads["S"].wrapped
        assert len(driven(daemon, intent.id)) == 1


# -- the relay is a pipe first ---------------------------------------------------------

class Tasks:
    """A task group that only counts what the wrapper would start."""

    def __init__(self) -> None:
        self.started: list[tuple] = []

    def start_soon(self, *args) -> None:
        self.started.append(args)


def relayed(monkeypatch, chunks: list[bytes], max_line: int) -> tuple[bytes, list[ev.Quarantined]]:
    """What the wrapper passes on to the harness of the CLI's ``chunks``, and what it
    quarantined."""
    out = bytearray()
    monkeypatch.setattr(claude_wrapper, "_to_harness", out.extend)
    with SQLiteRecorder(":memory:") as recorder:
        wrapper, tasks = claude_wrapper.Wrapper(recorder, [], max_line=max_line), Tasks()
        for chunk in chunks:
            wrapper.cli_output(tasks, chunk)
        wrapper.cli_ended(tasks)
        quarantined = [e.envelope.event for e in recorder.read() if isinstance(e.envelope.event, ev.Quarantined)]
    return bytes(out), quarantined


ODD_VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=6), st.lists(st.text(max_size=4), max_size=2),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
ODD_LINES = st.one_of(
    st.builds(lambda v: {"type": "command_lifecycle", "command_uuid": v, "state": "queued"}, ODD_VALUES),
    st.builds(lambda v: {"type": "control_response", "response": {"request_id": v}}, ODD_VALUES),
    st.builds(lambda v: {"type": "system", "subtype": "init", "session_id": "S", "user_message_uuids": [v]},
              ODD_VALUES),
    st.builds(lambda v: {"type": "result", "session_id": "S", "user_message_uuids": [v, "u"]}, ODD_VALUES),
    st.builds(lambda v: {"type": "user", "isReplay": True, "uuid": v, "message": {"content": "hi"}}, ODD_VALUES),
).map(lambda record: json.dumps(record).encode())
MAX = 64


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(ODD_LINES | st.binary(max_size=MAX).map(lambda b: b.replace(b"\n", b""))
                      | st.integers(MAX + 1, 3 * MAX).map(lambda n: b'{"type":"result","x":"' + b"a" * n + b'"}'),
                      max_size=8),
       newline_at_end=st.booleans(), cuts=st.lists(st.integers(0, 1000), max_size=6))
def test_whatever_the_cli_prints_reaches_the_harness_byte_for_byte_and_an_over_long_line_is_quarantined(
        monkeypatch, lines, newline_at_end, cuts):
    """Any JSON value in the fields the relay reads, arbitrary bytes, lines longer than
    the limit and a last line without its newline, in chunks cut anywhere."""
    printed = b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    points = sorted({0, len(printed), *(c % (len(printed) + 1) for c in cuts)})
    out, quarantined = relayed(monkeypatch, [printed[a:b] for a, b in itertools.pairwise(points)], MAX)
    assert out == printed
    too_long = sum(1 for line in lines if len(line) > MAX)
    assert sum(1 for q in quarantined if q.reason == "line_too_long") == too_long


def test_a_line_past_the_64_mib_limit_and_the_result_after_it_reach_the_harness(monkeypatch):
    """The wrapper once stopped at such a line (``DelimiterNotFound``): neither it nor the
    turn's ``result`` reached the harness."""
    huge = b'{"type":"assistant","message":{"content":"' + b"a" * MAX_LINE + b'"}}\n'
    result = b'{"type":"result","subtype":"success","session_id":"S"}\n'
    chunks = [huge[i:i + (1 << 20)] for i in range(0, len(huge), 1 << 20)] + [result]
    out, quarantined = relayed(monkeypatch, chunks, MAX_LINE)
    assert len(out) == len(huge) + len(result) and out.endswith(result) and out[:len(huge)] == huge
    assert [(q.offset, q.length, q.reason) for q in quarantined] == [(0, len(huge), "line_too_long")]


# -- all three sources at once: hooks, transcript, the wrapper --------------------------

PROMPT_ID, STREAM_UUID = "p-1", "u-1"  # the hooks' id of the turn, and stream-json's (the transcript's)


def three_sources(tmp_path, mode: str = "steer") -> tuple[claude_wrapper.Wrapper, Intent]:
    """The hooks saw the turn first (so ``--expected-turn active`` names it by its
    ``prompt_id``), the transcript linked its uuid to it, and the wrapper's relay runs it
    under that uuid with a tool call open."""
    recorder = SQLiteRecorder(tmp_path / "ledger.sqlite3")
    hooks, transcript = "file:/spool/S.jsonl", "file:/projects/-ws/S.jsonl"
    recorder.append([
        Envelope(event_id="h0", event=ev.ThreadStarted(thread_id="S", source_format="claude-hooks"), source=hooks),
        Envelope(event_id="h1", event=ev.TurnStarted(thread_id="S", turn_id=PROMPT_ID), source=hooks),
        Envelope(event_id="t1", event=ev.TurnAlias(thread_id="S", turn_id=STREAM_UUID, alias=PROMPT_ID),
                 source=transcript),
        Envelope(event_id="t2", event=ev.TurnStarted(thread_id="S", turn_id=STREAM_UUID), source=transcript),
        Envelope(event_id="w1", event=ev.TurnStarted(thread_id="S", turn_id=STREAM_UUID), source="claude-wrapper:r"),
    ])
    intent = intent_requests.propose(recorder, thread_id="S", mode=mode, text="x", expected_turn="active",
                                     owner="ann")
    assert intent.expected_turn_id == PROMPT_ID
    wrapper = claude_wrapper.Wrapper(recorder, [])
    wrapper.session = "S"
    wrapper._refold()
    wrapper.relay.turn, wrapper.relay.tools = STREAM_UUID, {"toolu_1": STREAM_UUID}
    return wrapper, intent


@pytest.mark.parametrize("mode", ["steer", "interrupt"])
def test_an_intent_named_by_the_hooks_prompt_id_is_sent_in_the_wrappers_turn(tmp_path, mode):
    """The relay knows the turn by stream-json's uuid: the wrapper looks the intent's turn
    up through the alias table (a plain comparison left the steer unsent until it
    expired ``turn_ended``)."""
    wrapper, intent = three_sources(tmp_path, mode)
    assert wrapper._ready(wrapper.projection.intents[intent.id])
    wrapper.relay.turn = "u-2"  # another turn runs: not this one
    assert not wrapper._ready(wrapper.projection.intents[intent.id])
    wrapper.recorder.close()


def test_a_steer_for_the_active_turn_named_by_the_hooks_is_dispatched_into_the_wrappers_turn(tmp_path):
    """The dispatch names the running turn as the intent names it: by the relay's uuid, a
    steer that follows the active turn took it for a turn older than its proposal and
    sent nothing, its machine kept, so it was never claimed again (the hooks-and-wrapper
    live test waited 45 s for the steer)."""
    wrapper, intent = three_sources(tmp_path)
    fact = wrapper._dispatch_fact(wrapper.projection.intents[intent.id].intent)
    [steer] = Delivery(intent).handle(fact).commands
    assert (fact.active_turn, steer.expected_turn_id) == (PROMPT_ID, PROMPT_ID)
    assert wrapper._turn_ids("S", steer.expected_turn_id) == (PROMPT_ID, STREAM_UUID)  # what the relay waits for
    wrapper.recorder.close()


def test_the_steer_s_echo_and_its_turn_s_end_are_read_through_the_alias_table(tmp_path):
    """The CLI's evidence names the turn by stream-json's uuid: the echo acknowledges the
    steer (was ``echo_in_other_turn``, never acknowledged) and the turn's end withdraws
    a steer still queued (was left to run as the next turn)."""
    wrapper, intent = three_sources(tmp_path)
    snapshot = wrapper.projection.snapshot("S")
    echo = ev.UserMessage(thread_id="S", turn_id=STREAM_UUID, digest="d", size=1,
                          client_id=intent.client_user_message_id, item_id="m")
    machine = Delivery(intent, State.DISPATCH_UNKNOWN)
    [moved] = machine.handle(observed(snapshot, intent, echo, 1.0)).envelopes
    assert (moved.event.to_state, moved.event.reason) == ("acknowledged", "echo")
    ours, _ = wrapper.relay.message(intent.client_user_message_id, intent.id, "x", priority=None,
                                    expected_turns=wrapper._turn_ids("S", intent.expected_turn_id))
    ours.state = "queued"
    ended = b'{"type":"result"}\n'
    assert wrapper.relay.from_cli(ended, [ev.TurnCompleted(thread_id="S", turn_id=STREAM_UUID)]).withdraw == (ours,)
    wrapper.recorder.close()


# -- hooks and the wrapper, without the transcripts watched -----------------------------

def test_the_wrapper_ties_each_turn_to_the_hooks_prompt_id_through_the_transcript(monkeypatch, tmp_path):
    """The recorded session (real CLI 2.1.332) through ``tillerman claude`` and the hook
    spool, nobody watching the transcripts: stdout names no ``prompt_id``, so the fold
    had ten turns (each twice, one of each pair ``unclosed``). The wrapper reads the
    transcript's prompt lines and records each turn's alias: five turns, one set."""
    recorded = SESSIONS / "claude-live" / "hooks"
    stdout = (recorded / "stdout.jsonl").read_bytes()
    init = next(json.loads(line) for line in stdout.splitlines() if b'"init"' in line)
    transcript = claude_wrapper.transcript_path(tmp_path, init["cwd"], init["session_id"])
    transcript.parent.mkdir(parents=True)
    transcript.write_bytes((recorded / "transcript.jsonl").read_bytes())
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(claude_wrapper, "_to_harness", lambda data: None)
    with SQLiteRecorder(":memory:") as recorder:
        wrapper = claude_wrapper.Wrapper(recorder, [])
        for line in stdout.splitlines(keepends=True):
            wrapper.cli_output(Tasks(), line)
        wrapper.cli_ended(Tasks())
        wrapped = [e.envelope for e in recorder.read()]
    hooks_source = file_source(recorded / "hooks.jsonl")
    parsed, _ = parse("claude-hooks", (recorded / "hooks.jsonl").read_bytes(), source=hooks_source)
    hooks = [Envelope(event_id=f"h-{i}", event=p.event, source=hooks_source, at=p.at) for i, p in enumerate(parsed)]
    for order in ([*hooks, *wrapped], [*wrapped, *hooks]):
        projection = Projection()
        for seq, envelope in enumerate(order, 1):
            projection.apply_envelope(envelope, seq)
        thread = projection.threads[hooks[0].event.thread_id]
        assert len(thread.turn_states) == 5 and "unclosed" not in thread.turn_states.values(), thread.turn_states
    assert len([e for e in wrapped if isinstance(e.event, ev.TurnAlias)]) == 5  # one per turn, once


# -- following the ledger ---------------------------------------------------------------

FAKE_CLI = """\
import sys, time
for line in sys.stdin:
    print('{"type":"result","subtype":"success","session_id":"S"}', flush=True)
time.sleep(0.5)  # a session that runs a moment: the wrapper follows the ledger meanwhile
"""


def test_on_a_postgresql_ledger_the_wrapper_relays_and_exits_with_its_cli(postgres_dsn, tmp_path):
    """It once watched a file named after the database URL: the watch failed at once and
    took the wrapper down with a traceback, the CLI's output unrelayed."""
    cli = tmp_path / "claude"
    cli.write_text(f"#!{sys.executable}\n{FAKE_CLI}")
    cli.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "tillerman", "claude", "--ledger", postgres_dsn],
                          input='{"type":"user"}\n', capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, CLAUDE_BIN_ENV: str(cli), "PYTHONPATH": str(ROOT)})
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == '{"type":"result","subtype":"success","session_id":"S"}\n'


class LostFeed(ChangeFeed):
    """A database's feed whose connection is lost at the first wait."""

    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[int | None]:
        raise OperationalError("server closed the connection unexpectedly")
        yield None  # an async generator

    def close(self) -> None:
        self.closed = True


def test_a_feed_that_can_no_longer_tell_leaves_the_look_every_poll_interval(tmp_path, monkeypatch, caplog):
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
        feed = LostFeed()
        monkeypatch.setattr(recorder, "change_feed", lambda: feed)
        anyio.run(claude_wrapper.Wrapper(recorder, [])._follow_ledger)
    assert feed.closed
    assert "ledger changes not followed (server closed the connection unexpectedly)" in caplog.text


def test_a_commit_by_another_process_wakes_the_wrapper(tmp_path):
    with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder, \
            SQLiteRecorder(tmp_path / "ledger.sqlite3") as other:
        wrapper = claude_wrapper.Wrapper(recorder, [])

        async def commit_until_woken() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(wrapper._follow_ledger)
                with anyio.fail_after(10):
                    for n in itertools.count():  # the watch may need a moment to start
                        other.append([Envelope(event_id=f"e{n}", source="test",
                                               event=ev.ThreadStarted(thread_id=f"T{n}"))])
                        with anyio.move_on_after(0.2):
                            await wrapper._changed.wait()
                        if wrapper._changed.is_set():
                            break
                tg.cancel_scope.cancel()

        anyio.run(commit_until_woken)


@pytest.mark.parametrize(("printed", "ended"), [
    (b'{"type":"system","subtype":"init","session_id":"S","cwd":"/w"}\n', ["S"]),
    (b"", []),  # the CLI named no session: nothing ended
])
def test_the_session_ends_when_the_cli_exits(monkeypatch, printed, ended):
    """Stream-json has no line saying the session ended: the CLI's exit is the end."""
    monkeypatch.setattr(claude_wrapper, "_to_harness", lambda raw: None)
    with SQLiteRecorder(":memory:") as recorder:
        wrapper, tasks = claude_wrapper.Wrapper(recorder, []), Tasks()
        wrapper.cli_output(tasks, printed)
        wrapper.cli_ended(tasks)
        statuses = [e.envelope.event for e in recorder.read() if isinstance(e.envelope.event, ev.StatusChanged)]
    assert [(s.thread_id, s.status) for s in statuses] == [(session, ev.SESSION_ENDED) for session in ended]
