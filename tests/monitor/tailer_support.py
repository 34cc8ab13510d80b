"""Helpers for the file tailer tests: drive a tailer into a ledger, read what it holds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec

from tillerman.controller.replay.replayer import Replayer
from tillerman.ledger import events as ev
from tillerman.ledger.sqlite import SQLiteRecorder
from tillerman.monitor.tailer import Tailer
from tillerman.rules.files import default_ruleset

SESSIONS = Path(__file__).resolve().parents[2] / "fixtures" / "sessions"
THREAD = "01a229c4-3717-7c10-9d2e-5b7f0c9e1a01"


def drive(tailer: Tailer, recorder: SQLiteRecorder, *paths) -> int:
    """Poll each path and record every batch as the daemon does (events and offsets in one
    transaction); the number of duplicate offers the ledger saw."""
    duplicates = 0
    for path in paths:
        for batch in tailer.poll(str(path)):
            duplicates += recorder.append(batch.envelopes, offsets=batch.offsets).duplicates
    return duplicates


def gone(tailer: Tailer, recorder: SQLiteRecorder, path) -> None:
    for batch in tailer.gone(str(path)):
        recorder.append(batch.envelopes, offsets=batch.offsets)


def restart(recorder: SQLiteRecorder, **options) -> Tailer:
    return Tailer(known=recorder.file_offsets(), **options)


def facts(recorder: SQLiteRecorder, source_prefix: str = "file:") -> list[tuple]:
    """The file-derived envelopes in the ledger, without the time they were observed."""
    return [_fact(e.envelope) for e in recorder.read() if e.envelope.source.startswith(source_prefix)]


def _fact(env: ev.Envelope) -> tuple:
    return (env.event_id, ev.encode(env.event), env.source, env.at, env.offset, env.length)


def replayed(path) -> list[tuple]:
    """What offline replay records for the same file: what its source gave (observations,
    quarantines and usage), not what the rules decided."""
    recorder = SQLiteRecorder(":memory:")
    Replayer(recorder, default_ruleset()).run([str(path)])
    return [_fact(e.envelope) for e in recorder.read() if e.envelope.source.startswith("file:")
            and (ev.kind_of(e.envelope.event) in ev.OBSERVATION_KINDS
                 or isinstance(e.envelope.event, (ev.Quarantined, ev.Usage, ev.UsageReported)))]


def quarantines(recorder: SQLiteRecorder) -> list[ev.Quarantined]:
    return [e.envelope.event for e in recorder.read() if isinstance(e.envelope.event, ev.Quarantined)]


def rollout_line(i: int, kind: str = "agent_message", **extra) -> bytes:
    payload = {"type": kind, "message": f"line {i}", **extra}
    record = {"timestamp": f"2026-11-30T00:{i // 60 % 60:02d}:{i % 60:02d}Z", "type": "event_msg", "payload": payload}
    return json.dumps(record).encode() + b"\n"


def session_meta(thread: str = THREAD) -> bytes:
    record = {"timestamp": "2026-11-30T00:00:00Z", "type": "session_meta",
              "payload": {"id": thread, "originator": "codex_cli_rs", "cli_version": "0.163.0"}}
    return json.dumps(record).encode() + b"\n"


def rollout_name(thread: str = THREAD) -> str:
    return f"rollout-2026-11-30T00-04-14-{thread}.jsonl"


def append(path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)
        fh.flush()


def kinds(recorder: SQLiteRecorder) -> list[str]:
    return [ev.kind_of(e.envelope.event) for e in recorder.read()]


def offsets_by_source(recorder: SQLiteRecorder) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for e in recorder.read():
        env = e.envelope
        if env.offset is not None and not isinstance(env.event, ev.Quarantined):
            found.setdefault(env.source, []).append(env.offset)
    return found


def as_dict(row) -> dict:
    return msgspec.structs.asdict(row)


def chmod_works() -> bool:
    return os.geteuid() != 0
