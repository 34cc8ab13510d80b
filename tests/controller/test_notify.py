"""Overdue notices: logged once per intent, handed to --on-overdue once, and once more
when the intent settles; a slow or failing command never holds anything up."""

import json
import logging

import anyio
import pytest

from tillerman.controller import intent_requests
from tillerman.controller import notify as notify_module
from tillerman.controller.notify import OverdueNotifier
from tillerman.ledger import projections
from tillerman.ledger.intent_states import State
from tillerman.ledger.memory import MemoryRecorder

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _overdue_ledger():
    rec = MemoryRecorder()
    intent = intent_requests.propose(rec, now=0.0, thread_id="T", mode="queue", text="later", ack_deadline=10.0, owner="ann")
    return rec, intent


async def test_each_overdue_intent_is_announced_once_then_resolved(tmp_path, caplog):
    rec, intent = _overdue_ledger()
    out = tmp_path / "notices.jsonl"
    notifier = OverdueNotifier(f"cat >> {out}; echo >> {out}")
    caplog.set_level(logging.INFO, logger="tillerman")
    async with anyio.create_task_group() as tg:
        tg.start_soon(notifier.run)
        notifier.update(projections.load(rec), now=5.0)  # not yet due
        notifier.update(projections.load(rec), now=20.0)
        notifier.update(projections.load(rec), now=30.0)  # still overdue: no second notice
        intent_requests.transition(rec, intent.id, State.EXPIRED, "cancelled")
        notifier.update(projections.load(rec), now=31.0)
        with anyio.fail_after(10):
            # two complete notices: a JSON line each (the command adds its own newline)
            while not out.exists() or len([line for line in out.read_text().splitlines() if line.strip()]) < 2:
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    first, second = [json.loads(line) for line in out.read_text().split("\n") if line.strip()]
    assert first["intent"] == intent.id and first["deadline"] == "ack" and "resolved" not in first
    assert second["resolved"] is True and second["state"] == "expired"
    assert caplog.text.count(f"overdue: intent {intent.id}") == 1 and "resolved" in caplog.text


async def test_a_slow_or_failing_command_is_stopped_and_logged(monkeypatch, caplog):
    monkeypatch.setattr(notify_module, "COMMAND_TIMEOUT", 0.2)
    rec, _ = _overdue_ledger()
    caplog.set_level(logging.WARNING, logger="tillerman")
    cases = (("sleep 5", ("took longer than",)), ("cat >/dev/null; exit 3", ("exited 3",)),
             ("exit 4", ("exited 4", "could not take the notice")))  # exits unread: never a crash
    for command, expected in cases:
        caplog.clear()
        notifier = OverdueNotifier(command)
        async with anyio.create_task_group() as tg:
            tg.start_soon(notifier.run)
            notifier.update(projections.load(rec), now=20.0)
            with anyio.fail_after(5):
                while not any(text in caplog.text for text in expected):
                    await anyio.sleep(0.02)
            tg.cancel_scope.cancel()


def test_without_a_command_notices_are_only_logged(caplog):
    rec, intent = _overdue_ledger()
    caplog.set_level(logging.WARNING, logger="tillerman")
    OverdueNotifier(None).update(projections.load(rec), now=20.0)
    assert f"overdue: intent {intent.id}" in caplog.text
