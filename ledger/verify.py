"""Walking a ledger's chain: sequence, links, hashes, columns, payloads, head anchor.

Backend-independent: a backend hands over its rows in physical order (so a reorder
shows), the result of its own integrity check, and its anchor.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from ledger import events
from ledger.events import Envelope
from ledger.recorder import GENESIS, VerifyReport, content_digest, row_hash


def verify_rows(rows: Iterator[tuple], integrity: list[str], anchor: tuple[int, str] | None) -> VerifyReport:
    problems: list[str] = []
    notes: list[str] = []
    if integrity != ["ok"]:
        problems.append("PRAGMA integrity_check: " + "; ".join(integrity[:5]))
    expected_seq, prev, count = 1, GENESIS, 0
    anchor_seq = anchor[0] if anchor else None
    anchored_hash = GENESIS if anchor_seq == 0 else None
    for row in rows:
        (seq, event_id, at, observed_at, source, thread_id, turn_id, kind, _intent,
         offset, length, payload, digest, prev_hash, link) = row
        count += 1
        if problems:
            break  # the first bad seq is what a person needs; the rest follows from it
        where = f"seq {seq}"
        if isinstance(payload, str):  # a hand edit can turn the BLOB into TEXT
            payload = payload.encode("utf-8", "surrogateescape")
        if seq != expected_seq:
            problems.append(f"{where}: expected seq {expected_seq} (rows missing or reordered)")
            break
        if prev_hash != prev:
            problems.append(f"{where}: prev_hash does not match the hash of seq {seq - 1}")
            break
        try:
            event = events.decode(payload)
        except (msgspec.DecodeError, TypeError) as exc:
            problems.append(f"{where}: payload does not decode ({exc})")
            break
        env = Envelope(event_id=event_id, event=event, source=source, at=at,
                       observed_at=observed_at, offset=offset, length=length)
        if content_digest(env, payload) != digest:
            problems.append(f"{where}: content digest mismatch (row edited)")
            break
        if row_hash(prev, seq, env, payload, digest) != link:
            problems.append(f"{where}: hash mismatch (row edited)")
            break
        if (thread_id, turn_id, kind) != (event.thread_id, event.turn_id, events.kind_of(event)):
            problems.append(f"{where}: thread/turn/kind columns disagree with the payload (row edited)")
            break
        if seq == anchor_seq:
            anchored_hash = link
        prev, expected_seq = link, seq + 1
    last_seq = expected_seq - 1
    if not problems and anchor is not None:
        anchor_seq, anchor_hash = anchor
        if anchor_seq < 0:
            problems.append("head anchor file is unreadable")
        elif anchor_seq > last_seq:
            problems.append(
                f"head anchor names seq {anchor_seq} but the ledger ends at seq {last_seq}:"
                f" {anchor_seq - last_seq} row(s) cut off the tail"
            )
        elif anchored_hash != anchor_hash:
            problems.append(f"seq {anchor_seq}: hash differs from the head anchor")
        elif anchor_seq < last_seq:
            notes.append(f"head anchor lags by {last_seq - anchor_seq} row(s) (a crash after commit?)")
    elif not problems and anchor is None and last_seq > 0:
        notes.append("no head anchor file (an in-memory or copied ledger?): tail truncation cannot be checked")
    return VerifyReport(ok=not problems, rows=count, last_seq=last_seq,
                        problems=tuple(problems), notes=tuple(notes))
