"""The one place a recorder is chosen from where a person said the ledger is
(``--ledger``, ``$TILLERMAN_LEDGER``): a PostgreSQL database's URL, else a SQLite file.

It lies above the backends it opens and ``tillerman.ledger.location``, which every
backend may use to show a location: the backends never import it back.
"""

from __future__ import annotations

from pathlib import Path

from tillerman.ledger.location import is_database_url
from tillerman.ledger.recorder import Recorder


def open_recorder(location: str | Path, *, readonly: bool = False, must_exist: bool = False,
                  idle_transaction_limit: float | None = None) -> Recorder:
    """The recorder for ``location``. ``readonly``: never writes; ``must_exist``: a
    database without a ledger is refused instead of given one (a file's existence is
    the caller's to check: it has the path). ``idle_transaction_limit``: a database
    ledger's bound on a frozen writer's transaction (``PostgresRecorder``); a SQLite
    file has one writer process, which holds nobody else up."""
    if is_database_url(location):
        from tillerman.ledger.postgres import PostgresRecorder  # psycopg only for a database ledger

        return PostgresRecorder(str(location), readonly=readonly, create=not must_exist,
                                idle_transaction_limit=idle_transaction_limit)
    from tillerman.ledger.sqlite import SQLiteRecorder

    return SQLiteRecorder(location, readonly=readonly)
