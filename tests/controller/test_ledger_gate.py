"""The daemon's gate: while a round's commit is out on the commit thread, every other use
of the ledger waits for it — the thread leases too, which the lease keeper renews on the
loop (they were the one way past the gate: on PostgreSQL a renewal inside the round's
open transaction raised and ended the daemon)."""

from __future__ import annotations

import threading

from tillerman.controller.daemon.ledger_gate import GatedRecorder


class _Leases:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def renew(self, lease: str) -> str:
        self.log.append(f"renew {lease}")
        return lease


class _Recorder:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.path = "ledger"

    def leases(self) -> _Leases:
        return _Leases(self.log)

    def max_seq(self) -> int:
        self.log.append("max_seq")
        return 0


def _while_a_commit_is_out(recorder: _Recorder, gated: GatedRecorder, use) -> list[str]:
    release = threading.Event()

    def commit() -> None:
        release.wait(10)
        recorder.log.append("committed")

    done = gated.commit_off_loop(commit)
    user = threading.Thread(target=use)
    user.start()
    user.join(0.2)  # it must still be waiting at the gate
    release.set()
    done.result(10)
    user.join(10)
    return recorder.log


def test_a_lease_renewal_waits_for_the_rounds_commit() -> None:
    recorder = _Recorder()
    gated = GatedRecorder(recorder)
    leases = gated.leases()
    assert _while_a_commit_is_out(recorder, gated, lambda: leases.renew("T")) == ["committed", "renew T"]


def test_any_other_call_waits_for_it_too_and_plain_values_pass() -> None:
    recorder = _Recorder()
    gated = GatedRecorder(recorder)
    assert gated.path == "ledger"
    assert _while_a_commit_is_out(recorder, gated, gated.max_seq) == ["committed", "max_seq"]


def test_a_recorder_without_leases_has_none_through_the_gate() -> None:
    class _Alone(_Recorder):
        def leases(self) -> None:
            return None

    assert GatedRecorder(_Alone()).leases() is None
