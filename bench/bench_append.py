"""Ledger append, batched: tillerman's ``SQLiteRecorder.append`` against two baselines
storing the same events in the same run.

* **raw**: ``sqlite3.executemany`` of rows of the ledger's shape (same table, same
  indexes, same pragmas) with the same SHA-256 chain computed per row — the floor
  for a hash-chained SQLite store. Its rows come ready-made (payload bytes encoded
  beforehand); tillerman encodes each event, checks ids for duplicates and conflicts,
  checks intent moves and re-anchors the head on top. Budget: ≥ 0.6× raw.
* **eventsourcing**: the `eventsourcing` library's ``SQLiteApplicationRecorder``
  storing the same events (``StoredEvent``: the thread as originator, its position
  as version, the kind as topic, the same msgspec payload). Budget: ≥ 2×.

Every contender starts from an empty file in the same directory (WAL, synchronous
NORMAL: what each does by default or what tillerman sets) and writes N events in
batches of ``BATCH`` (the daemon's batch), one transaction per batch.

Dispatch records (``durable=True``: a full fsync before the transport is called)
are measured apart, one record per transaction, against raw single-row inserts
under ``synchronous = FULL``; they have no budget of their own (they are bounded by
the disk's fsync, not by tillerman).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sqlite3
import statistics
import tempfile

import msgspec

from bench.common import INFO, Row, alternate, at_least, fmt_rate, main, scratch_dir, timed
from tillerman.controller.daemon.daemon import BATCH
from tillerman.ledger import events as ev
from tillerman.ledger.event_keys import event_key
from tillerman.ledger.events import Envelope
from tillerman.ledger.migrations import migrate
from tillerman.ledger.recorder import GENESIS
from tillerman.ledger.sqlite import SQLiteRecorder

SEED = 6
RAW_BUDGET = 0.6
ES_BUDGET = 2.0
_INSERT = ("INSERT INTO events (seq, event_id, at, observed_at, source, thread_id, turn_id, kind, intent_id,"
           " offset, length, payload, digest, prev_hash, hash, id_key) VALUES (" + ", ".join("?" * 16) + ")")


def make_events(n: int, seed: int = SEED) -> list[Envelope]:
    """A session-shaped stream: turns of tool calls and messages over a few threads,
    with file records' ids and offsets (what replay and the tailer append)."""
    rnd = random.Random(seed)
    threads = [f"01a229c4-0000-7000-8000-{i:012x}" for i in range(8)]
    out: list[Envelope] = []
    offset = 0
    turn = {t: f"turn-{t[-4:]}-0" for t in threads}
    while len(out) < n:
        thread = rnd.choice(threads)
        r = rnd.random()
        tid = turn[thread]
        if r < 0.05:
            turn[thread] = tid = f"turn-{thread[-4:]}-{len(out)}"
            event = ev.TurnStarted(thread_id=thread, turn_id=tid)
        elif r < 0.10:
            event = ev.TurnCompleted(thread_id=thread, turn_id=tid, duration_ms=rnd.randrange(100, 90_000))
        elif r < 0.45:
            event = ev.ItemStarted(thread_id=thread, turn_id=tid, item_id=f"call-{len(out)}",
                                   item_type="commandExecution", tool="shell",
                                   args_digest=hashlib.sha256(str(rnd.random()).encode()).hexdigest())
        elif r < 0.80:
            event = ev.ItemCompleted(thread_id=thread, turn_id=tid, item_id=f"call-{len(out) - 1}",
                                     item_type="commandExecution", exit_code=rnd.choice((0, 0, 0, 1)),
                                     output_digest=hashlib.sha256(str(rnd.random()).encode()).hexdigest(),
                                     output_size=rnd.randrange(0, 20_000))
        else:
            event = ev.AgentMessage(thread_id=thread, turn_id=tid, size=rnd.randrange(10, 4000),
                                    digest=hashlib.sha256(str(rnd.random()).encode()).hexdigest())
        length = rnd.randrange(150, 3000)
        out.append(Envelope(event_id=file_event_id(seed, offset), event=event, source=f"file:/bench/{thread}.jsonl",
                            at=1_795_000_000.0 + len(out) * 0.01, observed_at=1_795_000_100.0,
                            offset=offset, length=length))
        offset += length
    return out


def file_event_id(seed: int, offset: int) -> str:
    """An id as a file's record gets one (``tillerman.monitor.identity``): a digest, so the
    ids of a stream fall anywhere in the ledger's id index, as real ones do; streams of
    other seeds are other files (the ids once ignored the seed, and every one-event stream
    of ``bench_postgres`` repeated the same id)."""
    return "f-" + hashlib.sha256(b"bench-%d|%d|0" % (seed, offset)).hexdigest()[:32]


def batches(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


# -- contenders ---------------------------------------------------------------------


def tillerman_append(path: str, chunks: list[list[Envelope]]) -> float:
    rec = SQLiteRecorder(path)
    try:
        return timed(lambda: [rec.append(chunk) for chunk in chunks])
    finally:
        rec.close()


def raw_rows(envs: list[Envelope]) -> list[tuple]:
    """The rows as a raw writer would hold them: columns ready, payload encoded, the id's
    key (``tillerman.ledger.event_keys``) computed."""
    return [(e.event_id, e.at, e.observed_at, e.source, e.event.thread_id, e.event.turn_id, ev.kind_of(e.event),
             None, e.offset, e.length, ev.encode(e.event), event_key(e.event_id)) for e in envs]


def _raw_connect(path: str, synchronous: str = "NORMAL") -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute(f"PRAGMA synchronous = {synchronous}")
    db.execute("BEGIN IMMEDIATE")
    migrate(db)
    db.execute("COMMIT")
    return db


def _raw_batch(db: sqlite3.Connection, rows: list[tuple]) -> None:
    """One transaction: read the head, chain every row (same digest and link as the
    ledger), insert them all."""
    encode, sha256 = msgspec.json.encode, hashlib.sha256
    db.execute("BEGIN IMMEDIATE")
    head = db.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    seq, prev = head if head else (0, GENESIS)
    out = []
    for event_id, at, observed_at, source, thread, turn, kind, intent, offset, length, payload, key in rows:
        seq += 1
        digest = sha256(encode([source, at, offset, length]) + payload).hexdigest()
        link = sha256(prev.encode() + encode([seq, event_id, at, observed_at, source, digest]) + payload).hexdigest()
        out.append((seq, event_id, at, observed_at, source, thread, turn, kind, intent, offset, length,
                    payload, digest, prev, link, key))
        prev = link
    db.executemany(_INSERT, out)
    db.execute("COMMIT")


def raw_append(path: str, chunks: list[list[tuple]]) -> float:
    db = _raw_connect(path)
    try:
        return timed(lambda: [_raw_batch(db, chunk) for chunk in chunks])
    finally:
        db.close()


def eventsourcing_append(path: str, chunks: list[list[Envelope]]) -> float:
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    datastore = SQLiteDatastore(path, originator_id_type="text")
    recorder = SQLiteApplicationRecorder(datastore)
    recorder.create_table()
    versions: dict[str, int] = {}

    def store() -> None:
        for chunk in chunks:
            stored = []
            for env in chunk:
                originator = env.event.thread_id or env.source
                version = versions[originator] = versions.get(originator, 0) + 1
                stored.append(StoredEvent(originator_id=originator, originator_version=version,
                                          topic=ev.kind_of(env.event), state=ev.encode(env.event)))
            recorder.insert_events(stored)

    try:
        return timed(store)
    finally:
        datastore.close()


# -- durable dispatch records -------------------------------------------------------------


def tillerman_durable(path: str, envs: list[Envelope]) -> float:
    rec = SQLiteRecorder(path)
    try:
        return timed(lambda: [rec.append([e], durable=True) for e in envs])
    finally:
        rec.close()


def raw_durable(path: str, rows: list[tuple]) -> float:
    db = _raw_connect(path, synchronous="FULL")
    try:
        return timed(lambda: [_raw_batch(db, [row]) for row in rows])
    finally:
        db.close()


# -- the benchmark --------------------------------------------------------------------------


def run(quick: bool) -> list[Row]:
    n = 5_000 if quick else 200_000
    n_durable = 20 if quick else 300
    repeats = 3 if quick else 5
    envs = make_events(n)
    env_chunks = batches(envs, BATCH)
    row_chunks = batches(raw_rows(envs), BATCH)
    durable_envs = make_events(n_durable, seed=SEED + 1)
    durable_rows = raw_rows(durable_envs)
    work = tempfile.mkdtemp(prefix="append-", dir=scratch_dir())
    counter = iter(range(10**9))

    def fresh(name: str) -> str:
        return os.path.join(work, f"{name}-{next(counter)}.sqlite3")

    def cleanup() -> None:
        for entry in os.listdir(work):
            os.unlink(os.path.join(work, entry))

    def each(fn, name, data):
        def contender() -> float:
            try:
                return fn(fresh(name), data)
            finally:
                cleanup()
        return contender

    try:
        times = alternate({
            "tillerman": each(tillerman_append, "tillerman", env_chunks),
            "raw": each(raw_append, "raw", row_chunks),
            "eventsourcing": each(eventsourcing_append, "es", env_chunks),
        }, repeats)
        durable = alternate({
            "tillerman": each(tillerman_durable, "tillerman", durable_envs),
            "raw": each(raw_durable, "raw", durable_rows),
        }, repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rate = {k: [n / t for t in v] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in rate.items()}
    vs_raw = med["tillerman"] / med["raw"]
    vs_es = med["tillerman"] / med["eventsourcing"]
    drate = {k: [n_durable / t for t in v] for k, v in durable.items()}
    dmed = {k: statistics.median(v) for k, v in drate.items()}
    detail = {"events": n, "batch": BATCH, "repeats": repeats,
              "seconds": {k: v for k, v in times.items()}}
    return [
        Row(f"append {BATCH}/batch vs raw executemany", fmt_rate(rate["tillerman"], "ev/s"),
            fmt_rate(rate["raw"], "ev/s"), vs_raw, f"≥ {RAW_BUDGET}×", at_least(vs_raw, RAW_BUDGET), detail),
        Row(f"append {BATCH}/batch vs eventsourcing", fmt_rate(rate["tillerman"], "ev/s"),
            fmt_rate(rate["eventsourcing"], "ev/s"), vs_es, f"≥ {ES_BUDGET}×", at_least(vs_es, ES_BUDGET), detail),
        Row("append durable (dispatch record), 1/txn", fmt_rate(drate["tillerman"], "rec/s"),
            fmt_rate(drate["raw"], "rec/s"), dmed["tillerman"] / dmed["raw"], "report", INFO,
            {"records": n_durable, "seconds": durable,
             "p50_ms": statistics.median(durable["tillerman"]) / n_durable * 1000}),
    ]


if __name__ == "__main__":
    main(run)
