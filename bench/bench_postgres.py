"""The PostgreSQL ledger: ``PostgresRecorder.append`` against raw psycopg writing the
same rows in the same run, on a throwaway server (``fixtures.postgres_server``, the
server's default durability: every commit flushed).

* **executemany**: per batch, one transaction that locks the head row, chains the rows
  (the same SHA-256 digest and link as the ledger), inserts them with psycopg's
  ``executemany`` (pipelined) and moves the head row — the floor for a hash-chained,
  gap-free PostgreSQL store. Its rows come ready-made (payload bytes encoded
  beforehand); tillerman encodes each event, checks ids for duplicates and conflicts
  and checks intent moves on top. Budget: ≥ 0.5×.
* **COPY**: the same, the rows sent with ``COPY … FROM STDIN`` (reported).
* **sequencing**: the raw batch without the head row (seqs from ``max(seq)``, safe only
  for one writer): what the lock and the head row's update cost (reported).
* **concurrent writers**: one-row appends from four writers at once (each its own
  recorder, as four processes would be) against one writer, the same rows in all: the
  head row serializes them, so this is what that serialization leaves (reported).
* **the fence**: a dispatch record (one row, ``durable=True``) appended under a lease
  (``fence=``: the token checked ``FOR SHARE`` in the transaction) followed by the
  re-check before the send (``still_held``), against the same record without either,
  interleaved. Budget: the p99 added ≤ 5 ms. Measured on a second server without fsync:
  the disk's flush is the same with and without the fence (tens of milliseconds, and
  noisy, on a shared disk) and would drown the fence's own cost.

Where no server can start (no binaries), the rows say why instead of a figure.
"""

from __future__ import annotations

import hashlib
import statistics
import uuid

import msgspec

from bench.bench_append import batches, make_events, raw_rows
from bench.common import INFO, Row, alternate, at_least, at_most, fmt_rate, main, percentile, timed
from tillerman.controller.daemon.daemon import BATCH
from tillerman.ledger.recorder import GENESIS

BUDGET = 0.5
FENCE_P99_MS = 5.0
SEED_SINGLES = 11
_INSERT = ("INSERT INTO events (seq, event_id, at, observed_at, source, thread_id, turn_id, kind, intent_id,"
           ' "offset", length, payload, digest, prev_hash, hash) VALUES (' + ", ".join(["%s"] * 15) + ")")
_COPY = ("COPY events (seq, event_id, at, observed_at, source, thread_id, turn_id, kind, intent_id,"
         ' "offset", length, payload, digest, prev_hash, hash) FROM STDIN')


def _chained(rows: list[tuple], seq: int, prev: str) -> list[tuple]:
    """The rows with their seqs and chain links, as the ledger stores them (names as UTF-8)."""
    encode, sha256 = msgspec.json.encode, hashlib.sha256
    out = []
    for event_id, at, observed_at, source, thread, turn, kind, intent, offset, length, payload, _sqlite_key in rows:
        seq += 1  # (PostgreSQL's table keeps no key beside the id: its index is on the id)
        digest = sha256(encode([source, at, offset, length]) + payload).hexdigest()
        link = sha256(prev.encode() + encode([seq, event_id, at, observed_at, source, digest]) + payload).hexdigest()
        out.append((seq, event_id.encode(), at, observed_at, source.encode(), thread and thread.encode(),
                    turn and turn.encode(), kind, intent, offset, length, payload, digest, prev, link))
        prev = link
    return out


def _raw_batch(conn, rows: list[tuple], *, how: str) -> None:
    with conn.transaction():
        if how == "unlocked":
            seq, prev = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone() or (
                0, GENESIS)
        else:
            seq, prev = conn.execute("SELECT seq, hash FROM chain_head FOR UPDATE").fetchone()
        out = _chained(rows, seq, prev)
        if how == "copy":
            with conn.cursor() as cur, cur.copy(_COPY) as copy:
                for row in out:
                    copy.write_row(row)
        else:
            with conn.cursor() as cur:
                cur.executemany(_INSERT, out)
        if how != "unlocked":
            conn.execute("UPDATE chain_head SET seq = %s, hash = %s", (out[-1][0], out[-1][14]))


def run(quick: bool) -> list[Row]:
    from fixtures.postgres_server import ThrowawayPostgres, unavailable

    if (reason := unavailable()) is not None:
        return [Row("postgres append vs raw executemany", f"skipped: {reason}", budget=f"≥ {BUDGET}×")]
    import psycopg

    from tillerman.ledger.postgres import PostgresRecorder

    n = 2_000 if quick else 50_000
    repeats = 3 if quick else 5
    envs = make_events(n)
    env_chunks = batches(envs, BATCH)
    row_chunks = batches(raw_rows(envs), BATCH)

    with ThrowawayPostgres(durable=True) as server:
        def fresh() -> str:
            dsn = server.create_database(f"b_{uuid.uuid4().hex[:12]}")
            PostgresRecorder(dsn).close()  # the ledger's schema, for every contender
            return dsn

        def tillerman() -> float:
            with PostgresRecorder(fresh()) as rec:
                return timed(lambda: [rec.append(chunk) for chunk in env_chunks])

        def raw(how: str):
            def contender() -> float:
                with psycopg.connect(fresh(), autocommit=True) as conn:
                    return timed(lambda: [_raw_batch(conn, chunk, how=how) for chunk in row_chunks])
            return contender

        times = alternate({"tillerman": tillerman, "executemany": raw("executemany"), "copy": raw("copy"),
                           "unlocked": raw("unlocked")}, repeats)

    with ThrowawayPostgres() as server:
        plain, fenced = _dispatch_latencies(PostgresRecorder(server.create_database("fence")), 40 if quick else 400)
        singles = make_events(200 if quick else 2000, seed=SEED_SINGLES)
        concurrent = alternate({
            str(writers): lambda writers=writers: _writers(server.create_database(f"w_{uuid.uuid4().hex[:12]}"),
                                                           singles, writers)
            for writers in (1, 4)}, repeats)

    rate = {k: [n / t for t in v] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in rate.items()}
    detail = {"events": n, "batch": BATCH, "repeats": repeats, "seconds": times}
    vs_many = med["tillerman"] / med["executemany"]
    added_ms = (percentile(fenced, 99) - percentile(plain, 99)) * 1000
    return [
        Row("postgres dispatch record: p99 added by the fence", f"{added_ms:.2f} ms",
            f"p99 {percentile(plain, 99) * 1000:.2f} ms unfenced", None, f"≤ {FENCE_P99_MS} ms",
            at_most(added_ms, FENCE_P99_MS),
            {"records": len(plain), "p50_ms": {"plain": percentile(plain, 50) * 1000,
                                               "fenced": percentile(fenced, 50) * 1000},
             "p99_ms": {"plain": percentile(plain, 99) * 1000, "fenced": percentile(fenced, 99) * 1000}}),
        Row(f"postgres append {BATCH}/batch vs raw executemany", fmt_rate(rate["tillerman"], "ev/s"),
            fmt_rate(rate["executemany"], "ev/s"), vs_many, f"≥ {BUDGET}×", at_least(vs_many, BUDGET), detail),
        Row("postgres 1-row appends: 4 concurrent writers vs 1", fmt_rate([len(singles) / t for t in concurrent["4"]],
                                                                          "ev/s"),
            fmt_rate([len(singles) / t for t in concurrent["1"]], "ev/s"),
            statistics.median(concurrent["1"]) / statistics.median(concurrent["4"]), "report", INFO,
            {"events": len(singles), "seconds": concurrent}),
        Row(f"postgres append {BATCH}/batch vs raw COPY", fmt_rate(rate["tillerman"], "ev/s"),
            fmt_rate(rate["copy"], "ev/s"), med["tillerman"] / med["copy"], "report", INFO, detail),
        Row(f"postgres head-row lock: raw {BATCH}/batch locked vs unlocked", fmt_rate(rate["executemany"], "ev/s"),
            fmt_rate(rate["unlocked"], "ev/s"), med["executemany"] / med["unlocked"], "report", INFO, detail),
    ]


def _writers(dsn: str, envs: list, writers: int) -> float:
    """Seconds for ``writers`` threads, each with its own recorder, to append ``envs``
    one row at a time between them (dealt round-robin)."""
    import threading

    from tillerman.ledger.postgres import PostgresRecorder

    PostgresRecorder(dsn).close()
    recorders = [PostgresRecorder(dsn) for _ in range(writers)]
    start = threading.Barrier(writers + 1)

    def write(rec, mine) -> None:
        start.wait()
        for env in mine:
            rec.append([env])

    threads = [threading.Thread(target=write, args=(rec, envs[i::writers])) for i, rec in enumerate(recorders)]
    for t in threads:
        t.start()
    try:
        return timed(lambda: (start.wait(), [t.join() for t in threads]))
    finally:
        for rec in recorders:
            rec.close()


def _dispatch_latencies(rec, n: int) -> tuple[list[float], list[float]]:
    """Seconds per dispatch, without and with the fence, interleaved (one record each)."""
    with rec:
        lease = rec.leases().acquire("T", "bench", 3600)
        plain, fenced = [], []
        for i in range(n):
            env = make_events(1, seed=1000 + i)[0]
            plain.append(timed(lambda env=env: rec.append([env], durable=True)))
            env = make_events(1, seed=100_000 + i)[0]
            fenced.append(timed(lambda env=env: (rec.append([env], durable=True, fence=lease),
                                                 rec.leases().still_held(lease))))
    return plain, fenced


if __name__ == "__main__":
    main(run)
