"""Schema versions and the migrations between them.

Each migration is a list of statements applied in one transaction; the version is
kept in ``PRAGMA user_version``. A ledger from a newer tillerman is refused, never
half-read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from tillerman.ledger.errors import SchemaError
from tillerman.ledger.event_keys import event_key


def _key_the_events(db: sqlite3.Connection) -> None:
    """5: the event ids found by an integer key (``tillerman.ledger.event_keys``) instead
    of a ``UNIQUE`` index on their text. SQLite cannot drop a column's ``UNIQUE``, so the
    table is built again, every row as it was (its hash covers none of the new column);
    of ids that share a key, all but the first keep none, and their own index keeps them
    unique."""
    db.create_function("tillerman_event_key", 1, event_key, deterministic=True)
    try:
        db.execute(_events_table("events_keyed", keyed=True))
        db.execute(f"INSERT INTO events_keyed ({EVENT_COLUMNS}, id_key)"
                   f" SELECT {EVENT_COLUMNS}, tillerman_event_key(event_id) FROM events ORDER BY seq")
    finally:
        db.create_function("tillerman_event_key", 1, None)
    db.execute("DROP TABLE events")  # and its indexes
    db.execute("ALTER TABLE events_keyed RENAME TO events")
    index_the_keys(db)
    db.execute("CREATE UNIQUE INDEX events_unkeyed ON events (event_id) WHERE id_key IS NULL")
    db.execute("CREATE INDEX events_intent ON events (intent_id, seq) WHERE intent_id IS NOT NULL")


KEY_INDEX = "events_key"


def index_the_keys(db: sqlite3.Connection) -> None:
    """The unique index of the ids' keys, built over rows stored without it (this
    schema's migration, or a load, which builds it last: ``tillerman.ledger.load``). Of
    ids that share a key the first keeps it, as if they had been appended since; the
    rest keep none, and ``events_unkeyed`` keeps them unique. One id stored twice is no
    shared key, and raises ``IntegrityError`` with nothing changed."""
    create = f"CREATE UNIQUE INDEX IF NOT EXISTS {KEY_INDEX} ON events (id_key)"
    try:
        db.execute(create)
        return
    except sqlite3.IntegrityError:
        pass  # a key two ids share: about 3 chances in 100 at a billion rows
    held: dict[int, set[str]] = {}
    later: list[tuple[int]] = []
    for seq, key, event_id in db.execute(
            "SELECT seq, id_key, event_id FROM events WHERE id_key IN"
            " (SELECT id_key FROM events GROUP BY id_key HAVING count(*) > 1) ORDER BY id_key, seq"):
        ids = held.setdefault(key, set())
        if event_id in ids:
            raise sqlite3.IntegrityError(f"UNIQUE constraint failed: the id {event_id} is stored twice")
        if ids:
            later.append((seq,))
        ids.add(event_id)
    db.executemany("UPDATE events SET id_key = NULL WHERE seq = ?", later)
    db.execute(create)


#: The stored columns of a row, in the order the ledger reads them (``id_key`` aside).
EVENT_COLUMNS = ("seq, event_id, at, observed_at, source, thread_id, turn_id, kind, intent_id, offset, length,"
                 " payload, digest, prev_hash, hash")


def _events_table(name: str, *, keyed: bool) -> str:
    """The events table as schema 1 made it (the id's text unique) or as schema 5 does
    (its key beside it, ``tillerman.ledger.event_keys``)."""
    event_id = "event_id TEXT NOT NULL" if keyed else "event_id TEXT NOT NULL UNIQUE"
    key = ",\n            id_key INTEGER" if keyed else ""
    return f"""CREATE TABLE {name} (
            seq INTEGER PRIMARY KEY,
            {event_id},
            at REAL,
            observed_at REAL NOT NULL,
            source TEXT NOT NULL,
            thread_id TEXT,
            turn_id TEXT,
            kind TEXT NOT NULL,
            intent_id TEXT,
            offset INTEGER,
            length INTEGER,
            payload BLOB NOT NULL,
            digest TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL{key}
        )"""


#: Each migration: statements, or a function of the connection, run in one transaction.
MIGRATIONS: tuple[tuple[str | Callable[[sqlite3.Connection], None], ...], ...] = (
    # 1: the event table, its lookups, and fold snapshots (4 drops two of the lookups)
    (
        _events_table("events", keyed=False),
        "CREATE INDEX events_thread ON events (thread_id, seq)",
        "CREATE INDEX events_intent ON events (intent_id, seq) WHERE intent_id IS NOT NULL",
        "CREATE INDEX events_kind ON events (kind, seq)",
        "CREATE TABLE snapshots (name TEXT PRIMARY KEY, seq INTEGER NOT NULL, state BLOB NOT NULL)",
    ),
    # 2: where the file tailer read each followed file up to (tillerman.ledger.file_offsets);
    # written in the same transaction as the events read from that span
    (
        """CREATE TABLE file_offsets (
            identity TEXT PRIMARY KEY,
            path TEXT NOT NULL,
            source TEXT NOT NULL,
            format TEXT NOT NULL,
            offset INTEGER NOT NULL,
            state TEXT NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX file_offsets_path ON file_offsets (path)",
    ),
    # 3: facts about the ledger itself (tillerman.ledger.sqlite META_*): the chain formula its rows
    # are hashed with, and whether a head anchor was ever written for it
    (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "INSERT INTO meta (key, value) VALUES ('chain_version', '1')",
    ),
    # 4: drop the indexes no query uses: every append paid for them (events_thread about a
    # quarter of a batched append's time, events_kind a few per cent). The reads left are by
    # seq (the table's key), by event_id (its UNIQUE index: duplicates and conflicts) and by
    # intent_id (events_intent: an intent's state and history).
    (
        "DROP INDEX IF EXISTS events_thread",
        "DROP INDEX IF EXISTS events_kind",
    ),
    # 5: the ids found through a unique integer key, not a UNIQUE index on their text
    (_key_the_events,),
)

SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite3.Connection) -> int:
    """Bring the schema up to SCHEMA_VERSION inside the caller's transaction."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"ledger schema version {version} is newer than this tillerman understands"
            f" ({SCHEMA_VERSION}); upgrade tillerman"
        )
    if version == 0 and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
        raise SchemaError("the file is a SQLite database but not a tillerman ledger")
    for statements in MIGRATIONS[version:]:
        for step in statements:
            if callable(step):
                step(db)
            else:
                db.execute(step)
    if version != SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return SCHEMA_VERSION
