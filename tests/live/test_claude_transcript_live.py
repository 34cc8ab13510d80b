"""The transcript and stdout the real Claude Code CLI 2.1.332 writes in a fresh session:
both readers count the turns the CLI's own ``result`` lines report, for the scenarios
the transcript reader used to get wrong (an API error, a priority-now message, an
interrupt killing a tool, a withdrawn message)."""

from pathlib import Path

import pytest

from fixtures import record_claude_sessions as scenarios
from fixtures.anthropic_model import AnthropicModel
from fixtures.claude_cli import ClaudeSession
from tests.monitor.support import parse
from tests.monitor.test_claude_live_transcripts import counts_from_stdout
from tillerman.ledger.events import ItemCompleted
from tillerman.monitor.counts import count

pytestmark = pytest.mark.live


@pytest.mark.parametrize("scenario", ["api-error", "priority-now", "interrupt-tool", "withdrawn"])
def test_transcript_turns_equal_the_clis_stdout(claude_cli: Path, anthropic_model: AnthropicModel, tmp_path: Path,
                                                scenario: str) -> None:
    with ClaudeSession(claude_cli, tmp_path, anthropic_model.base_url) as session:
        scenarios.SCENARIOS[scenario](session)
        session.close()
        transcript = session.transcript.read_bytes()
        truth = counts_from_stdout(session.lines)
    parsed, parser = parse("claude-transcript", transcript, source=str(session.transcript))
    events = [p.event for p in parsed]
    c = count(events)
    assert (c.turns, c.interrupted_turns, c.unclosed_turns) == truth
    assert c.quarantined == 0
    stream, _ = parse("claude-stream-json", session.stdout_log.read_bytes())
    s = count(p.event for p in stream)
    assert (s.turns, s.interrupted_turns, s.unclosed_turns) == truth
    if scenario == "interrupt-tool":
        assert [e.status for e in events if isinstance(e, ItemCompleted)][0] == "interrupted"
