"""Where a ledger is: a SQLite file's path, or a PostgreSQL database's URL. The one place
a recorder is chosen from what a person gave (``--ledger``, ``$TILLERMAN_LEDGER``)."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from tillerman.ledger.recorder import Recorder

URL_SCHEMES = ("postgresql://", "postgres://")


def is_database_url(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(URL_SCHEMES)


def open_recorder(location: str | Path, *, readonly: bool = False, must_exist: bool = False) -> Recorder:
    """The recorder for ``location``. ``readonly``: never writes; ``must_exist``: a
    database without a ledger is refused instead of given one (a file's existence is
    the caller's to check: it has the path)."""
    if is_database_url(location):
        from tillerman.ledger.postgres import PostgresRecorder  # psycopg only for a database ledger

        return PostgresRecorder(str(location), readonly=readonly, create=not must_exist)
    from tillerman.ledger.sqlite import SQLiteRecorder

    return SQLiteRecorder(location, readonly=readonly)


def shown(dsn: str) -> str:
    """A database URL without its password, for messages and ``status``."""
    parts = urllib.parse.urlsplit(dsn)
    if parts.password is None:
        return dsn
    host = parts.netloc.rsplit("@", 1)[1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
