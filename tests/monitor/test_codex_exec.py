import json

from tests.monitor.support import jsonl, kinds, parse
from tillerman.ledger.events import AgentMessage, Error, ItemCompleted, ItemStarted, TurnCompleted
from tillerman.monitor.counts import count


def run(*records: dict):
    parsed, parser = parse("codex-exec", jsonl(*(json.dumps(r) for r in records)))
    return [p.event for p in parsed], parsed, parser


def test_a_stream_that_stops_mid_turn_leaves_the_turn_unclosed():
    evs, parsed, _ = run(
        {"type": "thread.started", "thread_id": "th"},
        {"type": "turn.started"},
        {"type": "item.started", "item": {"id": "item_0", "type": "command_execution",
                                          "command": "bash -lc 'cargo publish'", "status": "in_progress"}},
    )
    assert kinds(evs) == ["thread_started", "turn_started", "item_started"]
    started = evs[2]
    assert isinstance(started, ItemStarted) and (started.critical, started.external) == (True, True)
    assert started.turn_id == evs[1].turn_id == "turn@46" and started.thread_id == "th"
    assert all(p.at is None for p in parsed)  # the format has no timestamps
    assert count(evs).unclosed_turns == 1


def test_items_and_turn_outcomes():
    evs, _, parser = run(
        {"type": "thread.started", "thread_id": "th"},
        {"type": "turn.started"},
        {"type": "item.completed", "item": {"id": "item_0", "type": "reasoning", "text": "thinking"}},
        {"type": "item.updated", "item": {"id": "item_1", "type": "todo_list", "items": []}},
        {"type": "item.completed", "item": {"id": "item_2", "type": "command_execution", "command": "ls",
                                            "aggregated_output": "a\n", "exit_code": 1, "status": "failed"}},
        {"type": "item.completed", "item": {"id": "item_3", "type": "agent_message", "text": "see in-aaaaaaaaaaaaaaaaaaaa"}},
        {"type": "item.completed", "item": {"id": "item_4", "type": "error", "message": "tool crashed"}},
        {"type": "item.completed", "item": {"id": "item_5", "type": "hologram"}},
        {"type": "turn.completed", "usage": {}},
        {"type": "turn.started"},
        {"type": "turn.failed", "error": {"message": "rate limited"}},
        {"type": "mystery"},
    )
    assert kinds(evs) == ["thread_started", "turn_started", "item_completed", "agent_message", "error",
                          "turn_completed", "turn_started", "error", "turn_completed"]
    done = evs[2]
    assert isinstance(done, ItemCompleted) and (done.status, done.exit_code, done.output_size) == ("failed", 1, 2)
    assert isinstance(evs[3], AgentMessage) and evs[3].ack_tokens == ("in-aaaaaaaaaaaaaaaaaaaa",)
    assert isinstance(evs[4], Error)
    ends = [e for e in evs if isinstance(e, TurnCompleted)]
    assert [e.status for e in ends] == ["completed", "failed"]
    assert ends[0].turn_id != ends[1].turn_id
    assert parser.unknown_types == {"item:hologram": 1, "mystery": 1}
