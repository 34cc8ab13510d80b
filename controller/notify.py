"""Overdue notices: logged as intents become overdue, and handed to ``--on-overdue``.

The command gets the overdue intent as JSON on stdin, once per intent, and once more
(``"resolved": true``) when that intent settles. Commands run in their own task with
a timeout, so a failing or slow command never delays dispatching.
"""

from __future__ import annotations

import json
import logging
import subprocess

import anyio

from tillerman.controller.overdue import overdue
from tillerman.controller.render import overdue_json
from tillerman.ledger.intent_states import is_terminal
from tillerman.ledger.projections import Projection

log = logging.getLogger("tillerman")
COMMAND_TIMEOUT = 30.0


class OverdueNotifier:
    def __init__(self, command: str | None) -> None:
        self.command = command
        self.notified: dict[str, dict] = {}  # intent id -> the notice sent
        self._send, self._receive = anyio.create_memory_object_stream[dict](1000)

    def update(self, projection: Projection, now: float) -> None:
        """Called by the brain after each step: new overdue intents, settled ones."""
        for item in overdue(projection, now):
            if item.intent_id not in self.notified:
                notice = overdue_json(item)
                self.notified[item.intent_id] = notice
                log.warning("overdue: intent %s on thread %s (%s, %s deadline): %s", item.intent_id,
                            item.thread_id, item.state, item.deadline, item.why)
                self._queue(notice)
        for intent_id, notice in list(self.notified.items()):
            view = projection.intents.get(intent_id)
            if view is not None and is_terminal(view.state, view.intent):
                del self.notified[intent_id]
                log.info("resolved: overdue intent %s settled as %s", intent_id, view.state)
                self._queue({**notice, "resolved": True, "state": view.state})

    def _queue(self, notice: dict) -> None:
        if self.command is None:
            return
        try:
            self._send.send_nowait(notice)
        except anyio.WouldBlock:
            log.error("overdue notices are backing up; dropped the one for %s", notice["intent"])

    async def run(self) -> None:
        async for notice in self._receive:
            with anyio.move_on_after(COMMAND_TIMEOUT) as scope:
                await self._hand_over(notice)
            if scope.cancelled_caught:
                log.warning("--on-overdue took longer than %ss; stopped it", COMMAND_TIMEOUT)

    async def _hand_over(self, notice: dict) -> None:
        """Run the command once with the notice on stdin; whatever it does, only log."""
        done = None
        try:
            done = await anyio.run_process(self.command, input=json.dumps(notice).encode(), check=False,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except* (OSError, anyio.BrokenResourceError) as failed:  # could not start, or left stdin unread
            log.warning("--on-overdue could not take the notice: %r", failed.exceptions[0])
        if done is not None and done.returncode:
            log.warning("--on-overdue exited %s: %s", done.returncode, done.stderr.decode()[-200:])
