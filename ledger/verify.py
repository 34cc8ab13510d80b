"""Walking a ledger's chain: sequence, links, hashes, columns, payloads, head anchor,
and the saved fold snapshot.

Backend-independent: a backend hands over its rows in physical order (so a reorder
shows), the result of its own integrity check, and its anchor. Everything a reader
trusts is checked here: the chained columns by their hashes, the derived columns
(thread, turn, kind, intent) against the payload, the snapshot by folding the chain
again up to its seq.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

from tillerman.ledger import events, projections
from tillerman.ledger.batch import intent_id_of
from tillerman.ledger.events import Entry, Envelope, LedgerArchived, TailAccepted
from tillerman.ledger.recorder import CHAIN_VERSION, GENESIS, VerifyReport, content_digest, row_hash


def check_row(row: tuple) -> tuple[events.AnyEvent, str | None]:
    """One stored row against itself: its content digest, its hash from its own
    ``prev_hash``, and the derived columns against the payload. The row's event, and
    what is wrong (None: nothing). Whether ``prev_hash`` is the previous row's hash is
    the caller's walk."""
    (seq, event_id, at, observed_at, source, thread_id, turn_id, kind, intent_id,
     offset, length, payload, digest, prev_hash, link) = row
    if isinstance(payload, str):  # a hand edit can turn the BLOB into TEXT
        payload = payload.encode("utf-8", "surrogateescape")
    # A payload this version cannot decode is still chained: its hash below proves it
    # is what was written, so it is a note (readers skip it), not damage.
    event = events.decode_stored(payload, kind, thread_id, turn_id)
    env = Envelope(event_id=event_id, event=event, source=source, at=at,
                   observed_at=observed_at, offset=offset, length=length)
    if content_digest(env, payload) != digest:
        return event, "content digest mismatch (row edited)"
    if row_hash(prev_hash, seq, env, payload, digest) != link:
        return event, "hash mismatch (row edited)"
    if not isinstance(event, events.Undecodable) and (thread_id, turn_id, kind, intent_id) != (
            event.thread_id, event.turn_id, events.kind_of(event), intent_id_of(event)):
        return event, "thread/turn/kind/intent columns disagree with the payload (row edited)"
    return event, None


def verify_rows(rows: Iterator[tuple], integrity: list[str], anchor: tuple[int, str] | None,
                *, had_anchor: bool = False) -> tuple[list[str], list[str], int, int]:
    """The chain walk: (problems, notes, rows walked, last good seq)."""
    problems: list[str] = []
    notes: list[str] = []
    if integrity != ["ok"]:
        problems.append("PRAGMA integrity_check: " + "; ".join(integrity[:5]))
    expected_seq, prev, count = 1, GENESIS, 0
    anchor_seq = anchor[0] if anchor else None
    anchored_hash = GENESIS if anchor_seq == 0 else None
    walk: list[str] = []
    for row in rows:
        seq, prev_hash, link = row[0], row[13], row[14]
        count += 1
        where = f"seq {seq}"
        if seq != expected_seq:
            walk.append(f"{where}: expected seq {expected_seq} (rows missing or reordered)")
            break
        if prev_hash != prev:
            walk.append(f"{where}: prev_hash does not match the hash of seq {seq - 1}")
            break
        event, problem = check_row(row)
        if problem:
            walk.append(f"{where}: {problem}")
            break
        if isinstance(event, events.Undecodable):
            notes.append(f"{where}: payload does not decode with this version ({event.error}); readers skip it")
        if isinstance(event, TailAccepted):
            named = "no anchor" if event.anchor_seq is None else f"an anchor at seq {event.anchor_seq}"
            notes.append(f"{where}: {event.by} accepted a ledger ending at seq {event.ledger_seq} ({named})")
        if isinstance(event, LedgerArchived):
            notes.append(f"{where}: {event.rows} row(s) of {event.threads} thread(s) closed before {_utc(event.before)}"
                         f" are in the archive segment {event.segment}")
        if seq == anchor_seq:
            anchored_hash = link
        prev, expected_seq = link, seq + 1
    problems += walk
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
            notes.append(f"head anchor lags by {last_seq - anchor_seq} row(s) (a crash or a full disk after"
                         " a commit; the next write catches it up)")
    elif not problems and anchor is None and had_anchor:
        problems.append("the head anchor file is missing, but this ledger had one (deleted?):"
                        " tail truncation cannot be ruled out")
    elif not problems and anchor is None and last_seq > 0:
        notes.append("no head anchor file (an in-memory or copied ledger?): tail truncation cannot be checked")
    return problems, notes, count, last_seq


def verify_ledger(rows: Iterator[tuple], integrity: list[str], anchor: tuple[int, str] | None, *,
                  chain_version: int = CHAIN_VERSION, had_anchor: bool = False, unreadable: list[str] = (),
                  snapshot: Callable[[str], tuple[int, bytes] | None] = lambda name: None,
                  entries: Callable[..., Iterator[Entry]] | None = None) -> VerifyReport:
    """The whole check: the chain walk, rows the store could not read, the formula
    version, and the fold snapshot against a fold of the chain."""
    if chain_version != CHAIN_VERSION:
        return VerifyReport(ok=False, rows=0, last_seq=0, chain_version=chain_version, problems=(
            f"chain formula version {chain_version} is unknown to this tillerman (it knows {CHAIN_VERSION});"
            " upgrade tillerman",))
    problems, notes, count, last_seq = verify_rows(rows, integrity, anchor, had_anchor=had_anchor)
    if unreadable:
        problems.insert(0, f"rows after seq {last_seq} cannot be read ({unreadable[0]}): the last good seq is"
                           f" {last_seq}")
    if not problems and entries is not None:
        problems += _snapshot_problems(snapshot(projections.SNAPSHOT_NAME), entries, last_seq)
    return VerifyReport(ok=not problems, rows=count, last_seq=last_seq, problems=tuple(problems),
                        notes=tuple(notes), chain_version=chain_version)


def _snapshot_problems(saved: tuple[int, bytes] | None, entries: Callable[..., Iterator[Entry]],
                       last_seq: int) -> list[str]:
    """The saved fold must be what folding the chain up to its seq gives: readers start
    from it, so a forged one would change what they show."""
    if saved is None:
        return []
    seq, state = saved
    name = projections.SNAPSHOT_NAME
    if seq > last_seq:
        return [f"snapshot {name} claims seq {seq}, beyond the chain's last seq {last_seq} (forged?)"]
    stored = projections.decode_state(state)
    if stored is None:
        return []  # readers refold from seq 0 instead: costs time, changes nothing
    # up to the seq, not that many rows: an archived ledger's live rows have gaps
    if stored != projections.Projection().fold(itertools.takewhile(lambda e: e.seq <= seq, entries(after_seq=0))):
        return [f"snapshot {name} at seq {seq} differs from a fold of the chain up to it (edited)"]
    return []


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
