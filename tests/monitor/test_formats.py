import pytest

from tillerman.monitor.formats import PARSERS, detect_format, parser_for


@pytest.mark.parametrize(("head", "path", "expected"), [
    (b'{"timestamp":"2026-11-30T00:04:14.773Z","ordinal":0,"type":"session_meta","payload":{"id":"x"}}\n', "a.jsonl",
     "codex-rollout"),
    (b'{"timestamp":"t","type":"turn_context","payload":{}}\n', "x.jsonl", "codex-rollout"),
    (b'{"type":"thread.started","thread_id":"t"}\n{"type":"turn.started"}\n', "out.jsonl", "codex-exec"),
    (b'{"type":"turn.started"}\n', "out.jsonl", "codex-exec"),
    (b'{"ts":"2025-08-10T03:12:26.500Z","dir":"meta","kind":"session_start"}\n', "rec.jsonl", "codex-tui"),
    (b'{"ts": 1796001143.68, "dir": "out", "msg": {"id": "tl-1", "method": "initialize"}}\n', "t.jsonl",
     "appserver-trace"),
    (b'{"type":"queue-operation","operation":"dequeue","sessionId":"s"}\n', "s.jsonl", "claude-transcript"),
    (b'{"type":"summary","summary":"x","leafUuid":"u"}\n', "s.jsonl", "claude-transcript"),
    (b'{"parentUuid":null,"isSidechain":true,"agentId":"a1","type":"user"}\n', "p/s/subagents/agent-a1.jsonl",
     "claude-transcript"),
    (b"", "proj/0c1e/subagents/agent-a2898e3.jsonl", "claude-transcript"),
    # First records that name nothing: the next one, or the file name, decides.
    (b'{"hello":1}\n{"type":"turn.started"}\n', "x.jsonl", "codex-exec"),
    (b'{"hello":1}\n', "sessions/2025/09/02/rollout-2025-09-02T10-00-00-abc.jsonl", "codex-rollout"),
    # A first line longer than the head: its opening still tells.
    (b'{"timestamp":"t","type":"session_meta","payload":{"base_instructions":"' + b"x" * 100, "a.jsonl",
     "codex-rollout"),
    (b'{"type":"api-request-blob","sessionId":"s","body":"' + b"x" * 100, "a.jsonl", "claude-transcript"),
    (b"not json at all\n", "notes.jsonl", None),
    (b"", "empty.jsonl", None),
])
def test_detect_format(head, path, expected):
    assert detect_format(head, path) == expected


def test_registry_names_every_parser_by_its_format():
    assert sorted(PARSERS) == ["appserver-trace", "claude-hook-log", "claude-hooks", "claude-stream-json",
                              "claude-transcript", "codex-exec", "codex-rollout", "codex-tui"]
    for name, parser in PARSERS.items():
        assert parser.format == name and parser_for(name) is parser
        assert parser.untimed == (name in ("codex-exec", "claude-hooks"))
