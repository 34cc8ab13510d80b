"""The daemon asks ``account/usage/read`` at the end of a supervised thread's turn and
records the server's estimate beside our figures; a server that refuses it (an older
one without the method, or none signed in, as offline) is asked no more on that
connection: one refusal, not one per turn (docs/usage/usage-and-budgets.md)."""

from __future__ import annotations

import anyio
import pytest

from tests.controller.test_adapter import FakeAppServer
from tests.monitor.test_codex_usage import THREAD, account_usage
from tillerman.controller.daemon.daemon import Daemon, DaemonOptions
from tillerman.ledger.events import UsageReported
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.jsonrpc import RpcError
from tillerman.rules.files import default_ruleset

AUTH_REQUIRED = RpcError(-32600, "codex account authentication required to read token usage")
NO_METHOD = RpcError(-32601, "method not found: account/usage/read")


def pending(daemon: Daemon) -> list:
    envelopes = []
    while True:
        try:
            envelopes += daemon._inbox.receive_nowait()
        except anyio.WouldBlock:
            return envelopes


@pytest.mark.parametrize("refusal", [AUTH_REQUIRED, NO_METHOD], ids=["no-account", "no-method"])
def test_a_refused_read_is_not_asked_again_on_that_connection(tmp_path, refusal):
    async def run():
        with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
            daemon = Daemon(recorder, default_ruleset(), DaemonOptions())
            server = FakeAppServer(account__usage__read=refusal)
            for turn in ("T1", "T2", "T3"):
                await daemon._read_account_usage(server, THREAD, turn)
            assert server.methods() == ["account/usage/read"]
            assert pending(daemon) == [] and daemon.tap.account_usage_wanted([]) == []
            daemon.tap.connected()  # the next connection asks once more
            await daemon._read_account_usage(server, THREAD, "T4")
            assert server.methods() == ["account/usage/read"] * 2

    anyio.run(run)


def test_an_answered_read_is_recorded_beside_our_figures(tmp_path):
    async def run():
        with SQLiteRecorder(tmp_path / "ledger.sqlite3") as recorder:
            daemon = Daemon(recorder, default_ruleset(), DaemonOptions())
            server = FakeAppServer(account__usage__read=account_usage(micros=2_500_000))
            await daemon._read_account_usage(server, THREAD, "T1")
            await daemon._read_account_usage(server, THREAD, "T2")
            assert server.sent == [("account/usage/read", {"threadId": THREAD})] * 2
            reported = [e.event for e in pending(daemon)]
            assert all(isinstance(r, UsageReported) and r.source_kind == "codex_account" and r.cost_usd == 2.5
                       for r in reported)
            assert [r.turn_id for r in reported] == ["T1", "T2"]

    anyio.run(run)
