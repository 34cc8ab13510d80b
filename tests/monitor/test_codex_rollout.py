import json

import pytest

from tests.monitor.support import events, jsonl, kinds, parse, reasons
from tillerman.ledger.events import (
    AgentMessage,
    ItemCompleted,
    ItemStarted,
    ThreadNamed,
    ThreadStarted,
    TurnCompleted,
    TurnStarted,
    UserMessage,
    encode,
)
from tillerman.monitor.counts import count
from tillerman.monitor.digest import digest

THREAD = "0199a1b2-0000-7000-8000-00000000aa01"


def line(kind: str, payload: dict, ts: str = "2026-11-30T00:00:00.000Z") -> str:
    return json.dumps({"timestamp": ts, "type": kind, "payload": payload})


def msg(**payload) -> str:
    return line("event_msg", payload)


def item(**payload) -> str:
    return line("response_item", payload)


def test_old_cli_turns_run_from_one_user_message_to_the_next():
    evs = events("codex-rollout", jsonl(
        line("session_meta", {"id": THREAD, "cli_version": "0.40.0"}),
        msg(type="user_message", message="first"),
        msg(type="agent_message", message="ok"),
        msg(type="user_message", message="second"),
        msg(type="turn_aborted", reason="interrupted"),
        msg(type="user_message", message="third"),
    ))
    assert kinds(evs) == ["thread_started", "turn_started", "user_message", "agent_message",
                          "turn_completed", "turn_started", "user_message", "turn_completed",
                          "turn_started", "user_message"]
    first, second, third = (e.turn_id for e in evs if isinstance(e, TurnStarted))
    assert len({first, second, third}) == 3 and first.startswith("turn@")
    ends = [e for e in evs if isinstance(e, TurnCompleted)]
    assert [(e.turn_id, e.status) for e in ends] == [(first, "completed"), (second, "interrupted")]
    c = count(evs)
    assert (c.turns, c.interrupted_turns, c.unclosed_turns) == (3, 1, 1)


def test_a_second_user_message_in_an_open_turn_is_a_steer_not_a_turn():
    evs = events("codex-rollout", jsonl(
        msg(type="task_started", turn_id="T1"),
        msg(type="item_completed", item={"type": "UserMessage", "id": "u1", "client_id": None,
                                         "content": [{"type": "text", "text": "go"}]}),
        msg(type="item_completed", item={"type": "UserMessage", "id": "u2",
                                         "client_id": "tillerman-in-0123456789abcdef0123",
                                         "content": [{"type": "text", "text": "steer"}]}),
        msg(type="item_completed", item={"type": "AgentMessage", "id": "m1",
                                         "content": [{"type": "Text", "text": "done in-0123456789abcdef0123"}]}),
        msg(type="task_complete", turn_id="T1", duration_ms=12),
    ))
    assert kinds(evs).count("turn_started") == 1
    users = [e for e in evs if isinstance(e, UserMessage)]
    assert [(u.turn_id, u.item_id, u.client_id) for u in users] == [
        ("T1", "u1", None), ("T1", "u2", "tillerman-in-0123456789abcdef0123")]
    agent = next(e for e in evs if isinstance(e, AgentMessage))
    assert agent.ack_tokens == ("in-0123456789abcdef0123",)
    assert evs[-1] == TurnCompleted(thread_id="test", turn_id="T1", status="completed", duration_ms=12)  # no session_meta: the file name's thread


def test_one_input_written_both_ways_is_one_user_message():
    said = {"type": "UserMessage", "id": "u1", "client_id": None, "content": [{"type": "text", "text": "hi"}]}
    for order in ([msg(type="user_message", message="hi"), msg(type="item_completed", item=said)],
                  [msg(type="item_completed", item=said), msg(type="user_message", message="hi")]):
        evs = events("codex-rollout", jsonl(msg(type="task_started", turn_id="T"), *order))
        assert kinds(evs).count("user_message") == 1


def test_the_copy_carrying_the_client_id_is_kept():
    echoed = {"type": "UserMessage", "id": "u1", "client_id": "c-1", "content": [{"type": "text", "text": "hi"}]}
    evs = events("codex-rollout", jsonl(msg(type="task_started", turn_id="T"),
                                         msg(type="user_message", message="hi"),
                                         msg(type="item_completed", item=echoed)))
    assert [e.client_id for e in evs if isinstance(e, UserMessage)] == [None, "c-1"]


def test_tool_calls_are_classified_and_the_command_is_not_stored():
    evs = events("codex-rollout", jsonl(
        msg(type="task_started", turn_id="T"),
        item(type="function_call", name="shell", call_id="c1",
             arguments=json.dumps({"command": ["bash", "-lc", "git push origin main"]})),
        item(type="function_call_output", call_id="c1",
             output=json.dumps({"output": "pushed", "metadata": {"exit_code": 0}})),
        item(type="function_call", name="apply_patch_tool", call_id="c2", arguments="{}"),
        item(type="local_shell_call", call_id="c3", status="completed",
             action={"type": "exec", "command": ["curl", "-X", "POST", "https://api.example.com"]}),
        item(type="function_call_output", call_id="c3", output="Exit code: 7"),
    ))
    started = {e.item_id: e for e in evs if isinstance(e, ItemStarted)}
    assert (started["c1"].item_type, started["c1"].critical, started["c1"].external) == ("commandExecution", True, True)
    assert (started["c2"].item_type, started["c2"].critical) == ("functionCall", False)
    assert (started["c3"].critical, started["c3"].external) == (False, True)
    done = {e.item_id: e for e in evs if isinstance(e, ItemCompleted)}
    assert (done["c1"].status, done["c1"].exit_code, done["c1"].external) == ("completed", 0, True)
    assert (done["c3"].status, done["c3"].exit_code) == ("failed", 7)
    stored = b"".join(encode(e) for e in evs)
    assert b"git push" not in stored and b"pushed" not in stored and b"api.example.com" not in stored


def test_an_interrupted_command_stays_open_until_its_process_ends():
    evs = events("codex-rollout", jsonl(
        msg(type="task_started", turn_id="T1"),
        item(type="function_call", name="exec_command", call_id="c1", arguments='{"cmd": "sleep 4; git push"}'),
        msg(type="turn_aborted", turn_id="T1", reason="interrupted"),
        item(type="function_call_output", call_id="c1", output="Wall time: 0.7 seconds\naborted by user"),
        msg(type="task_started", turn_id="T2"),
        msg(type="item_completed", item={"type": "CommandExecution", "id": "c1", "status": "completed",
                                         "exit_code": 0, "aggregated_output": ""}),
    ))
    assert kinds(evs) == ["turn_started", "item_started", "turn_completed", "turn_started", "item_completed"]
    late = evs[-1]
    assert (late.turn_id, late.status, late.exit_code, late.external) == ("T1", "completed", 0, True)


def test_the_process_end_supersedes_the_tool_answer_once():
    evs = events("codex-rollout", jsonl(
        msg(type="task_started", turn_id="T"),
        item(type="function_call", name="exec_command", call_id="c1", arguments='{"cmd": "make"}'),
        item(type="function_call_output", call_id="c1", output="Process exited with code 0"),
        msg(type="exec_command_end", call_id="c1", exit_code=2, aggregated_output="boom"),
        msg(type="item_completed", item={"type": "CommandExecution", "id": "c1", "status": "failed", "exit_code": 2}),
    ))
    done = [(e.status, e.exit_code) for e in evs if isinstance(e, ItemCompleted)]
    assert done == [("completed", 0), ("failed", 2)]


def test_thread_from_session_meta_or_file_name():
    meta = events("codex-rollout", jsonl(line("session_meta", {
        "id": THREAD, "originator": "codex_cli_rs", "cli_version": "0.58.0", "forked_from_id": "parent-1"})))
    assert meta == [ThreadStarted(thread_id=THREAD, parent_thread_id="parent-1", originator="codex_cli_rs",
                                  cli_version="0.58.0", source_format="codex-rollout")]
    named = events("codex-rollout", jsonl(msg(type="task_started", turn_id="T")),
                   source=f"/x/sessions/2025/09/02/rollout-2025-09-02T10-00-00-{THREAD}.jsonl")
    assert named[0].thread_id == THREAD


def test_the_sessions_working_directory_is_a_digest_unless_payloads_are_retained():
    data = jsonl(line("session_meta", {"id": THREAD, "cwd": "/home/ann/acme"}))
    [private] = events("codex-rollout", data)
    [retained] = events("codex-rollout", data, retain_payloads=True)
    assert private.cwd is None and private.cwd_digest == digest("/home/ann/acme")
    assert (retained.cwd, retained.cwd_digest) == ("/home/ann/acme", private.cwd_digest)


def test_source_time_and_unknown_types():
    parsed, parser = parse("codex-rollout", jsonl(
        line("event_msg", {"type": "task_started", "turn_id": "T"}, ts="2026-11-30T00:00:01.500Z"),
        line("brand_new", {}), msg(type="shiny_new_event"), item(type="shiny_new_item"),
        msg(type="token_count", info=None)))
    assert parsed[0].at == 1795996801.5
    assert parser.unknown_types == {"brand_new": 1, "event_msg:shiny_new_event": 1, "response_item:shiny_new_item": 1}
    assert parser.records == 5


def test_payloads_are_kept_only_when_asked():
    data = jsonl(msg(type="task_started", turn_id="T"), msg(type="user_message", message="secret plan"))
    private = events("codex-rollout", data)[-1]
    retained = events("codex-rollout", data, retain_payloads=True)[-1]
    assert private.text is None and retained.text == "secret plan"
    assert private.digest == retained.digest and private.size == 11


def test_wrong_types_are_quarantined():
    evs = events("codex-rollout", jsonl(
        line("event_msg", 5),
        msg(type="user_message", message=["not", "text"]),
        msg(type="task_started", turn_id=7),
        json.dumps({"timestamp": 12, "type": "event_msg", "payload": {"type": "task_started"}}),
        msg(type="task_started", turn_id="ok"),
    ))
    assert reasons(evs) == ["wrong_type"] * 4
    assert kinds(evs)[-1] == "turn_started"


def test_tool_arguments_nested_too_deep_are_read_as_text():
    """The arguments are JSON inside a string: past the nesting limit they are the
    model's text to classify, not a reason to drop the record or to fail."""
    deep = '{"cmd":' * 100_000 + '"ls"' + "}" * 100_000
    evs = events("codex-rollout", jsonl(
        msg(type="task_started", turn_id="T"),
        item(type="function_call", name="exec_command", call_id="c1", arguments=deep),
        item(type="function_call_output", call_id="c1", output='{"metadata":' * 100_000 + "1" + "}" * 100_000),
    ))
    assert kinds(evs) == ["turn_started", "item_started", "item_completed"]
    assert evs[1].args_digest == digest(deep)


# What a rollout refuses: fields no event reads are skipped, checked for JSON syntax and
# UTF-8 only; numbers beyond a double and nesting past 128 levels count where read.
START = b'{"timestamp":"2026-11-30T00:00:00Z","type":"event_msg","payload":{"type":"task_started","turn_id":"T"'
DEEP = b"[" * 130 + b"]" * 130


@pytest.mark.parametrize("skipped", [b"1e400", b"[0,-12.5E+309]", b"9" * 250 + b"e99", DEEP])
@pytest.mark.parametrize("chunks", [None, [7] * 200])
def test_out_of_range_or_deep_content_in_a_field_no_event_reads_is_skipped(skipped, chunks):
    for where in (b',"zz":' + skipped + b"}}", b',"zz":' + skipped + b'},"zz":' + skipped + b"}"):
        evs = events("codex-rollout", START + where + b"\n", chunks=chunks)
        assert kinds(evs) == ["turn_started"], where


@pytest.mark.parametrize("chunks", [None, [7] * 200])
def test_invalid_utf8_in_a_field_no_event_reads_is_still_refused(chunks):
    evs = events("codex-rollout", START + b',"zz":"caf\xe9"}}\n', chunks=chunks)
    assert reasons(evs) == ["invalid_utf8"]


@pytest.mark.parametrize(("record", "reason"), [
    (b'{"timestamp":1e400,"type":"turn_context","payload":{}}', "number_out_of_range"),
    (START + b"}," + b'"timestamp":[1e400]}', "number_out_of_range"),
    (b'{"type":"response_item","payload":{"type":"function_call","name":"x","call_id":"c","arguments":'
     + b"[" * 127 + b"]" * 127 + b"}}", "too_deep"),
    (b'{"type":"event_msg","payload":{"type":"item_completed","item":{"type":"UserMessage","content":'
     + b"[" * 126 + b"]" * 126 + b"}}}", "too_deep"),
    (b'{"type":"event_msg","payload":{"type":"item_completed","item":' + DEEP + b"}}", "too_deep"),
    (b'{"type":"session_meta","payload":{"id":"t","source":' + b"[" * 127 + b"]" * 127 + b"}}", "too_deep"),
])
def test_out_of_range_or_deep_content_in_a_field_an_event_reads_is_refused(record, reason):
    assert reasons(events("codex-rollout", record + b"\n")) == [reason]


@pytest.mark.parametrize("record", [
    b'{"type":"response_item","payload":{"type":"function_call","name":"x","call_id":"c","arguments":'
    + b"[" * 126 + b"]" * 126 + b"}}",  # 128 levels with the record's
    b'{"type":"event_msg","payload":{"type":"item_completed","item":{"type":"UserMessage","content":'
    + b"[" * 125 + b"]" * 125 + b"}}}",
])
def test_read_content_nested_to_the_limit_is_read(record):
    assert reasons(events("codex-rollout", record + b"\n")) == []


@pytest.mark.parametrize(("body", "name"), [
    ({"thread_id": THREAD, "thread_name": "Fix the  checkout\ntest"}, "Fix the checkout test"),
    ({"thread_id": THREAD}, None),  # cleared
    ({"thread_id": THREAD, "thread_name": "x" * 300}, "x" * 200),
])
def test_a_thread_name_update_names_the_files_thread(body, name):
    evs = events("codex-rollout", jsonl(line("session_meta", {"id": THREAD}), msg(type="thread_name_updated", **body)))
    assert evs[1:] == [ThreadNamed(thread_id=THREAD, name=name)]


def test_a_thread_name_of_the_wrong_type_is_quarantined():
    evs = events("codex-rollout", jsonl(line("session_meta", {"id": THREAD}), msg(type="thread_name_updated",
                                                                                  thread_name=7)))
    assert reasons(evs) == ["wrong_type"]
