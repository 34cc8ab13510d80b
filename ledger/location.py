"""Where a ledger is: a SQLite file's path, or a PostgreSQL database's URL, and how a
location is shown to a person with its secrets masked (``shown``). The recorder for a
location is opened by ``tillerman.ledger.backends``."""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

URL_SCHEMES = ("postgresql://", "postgres://")


def is_database_url(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(URL_SCHEMES)


#: The connection parameters libpq takes a secret in: the server password, and the
#: passphrase of the client's key.
SECRET_KEYS = frozenset({"password", "sslpassword"})
MASK = "***"
#: A secret shorter than this is not searched for in free text: masking every "ab" of a
#: message would mangle it and, by the gaps, show the secret anyway.
SEARCHED_FROM = 4

# A URL's password, after the scheme and the user: libpq ends it at the first "@"; a
# password holding a raw "@" (libpq splits it into the host) is taken to the last "@"
# of its word, so that no piece of it shows.
_URL_PASSWORD = re.compile(r"(?P<user>[^:/@?]*:)(?P<password>[^@]*(?:@[^@/?\s]*(?=@))*)@")
# key=value conninfo (libpq's other form, and what its errors quote pieces of): a quoted
# value runs to its closing quote, backslash escapes included; a bare one to white space.
_KEYWORD = re.compile(r"\b(?P<key>password|sslpassword)(?P<eq>\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|\S*)")


def shown(text: str, dsn: str | None = None) -> str:
    """The one way a ledger's location, or a database's error, reaches a person, a log
    or ``status``: every credential masked.

    Without ``dsn``, ``text`` is the location (a ``postgresql://`` URL, or a conninfo
    string): its ``user:PASSWORD@`` (before every host of a multi-host URL), and
    ``password=`` / ``sslpassword=`` in its query (the key percent-encoded or not) or as a
    ``key=value``. With ``dsn``, ``text`` is a message about that database (a psycopg
    error, whose libpq text quotes the very token it could not parse): any conninfo
    secret in it, and every secret of ``dsn`` wherever it appears. ``$PGPASSWORD`` is
    never shown either way."""
    if dsn is None:
        masked, secrets = _masked_location(text), _secrets(text)
    else:
        masked, secrets = _KEYWORD.sub(_masked_keyword, text), _secrets(dsn)
    for secret in sorted(secrets, key=len, reverse=True):
        masked = masked.replace(secret, MASK)
    return masked


def _masked_location(location: str) -> str:
    if not is_database_url(location):
        return _KEYWORD.sub(_masked_keyword, location)
    scheme, rest = location.split("://", 1)
    if (userinfo := _URL_PASSWORD.match(rest)) is not None:
        rest = f"{userinfo['user']}{MASK}@{rest[userinfo.end():]}"
    base, question, query = rest.partition("?")
    parameters = [_masked_parameter(p) for p in query.split("&")] if question else []
    return f"{scheme}://{base}{question}{'&'.join(parameters)}"


def _masked_parameter(parameter: str) -> str:
    key, equals, _ = parameter.partition("=")
    return f"{key}={MASK}" if equals and urllib.parse.unquote(key) in SECRET_KEYS else parameter


def _masked_keyword(match: re.Match) -> str:
    return f"{match['key']}{match['eq']}{MASK}"


def _secrets(location: str) -> set[str]:
    """Every secret ``location`` holds, as written and decoded, and ``$PGPASSWORD``."""
    found = {os.environ.get("PGPASSWORD", "")}
    if is_database_url(location):
        rest = location.split("://", 1)[1]
        if (userinfo := _URL_PASSWORD.match(rest)) is not None:
            found |= {userinfo["password"], urllib.parse.unquote(userinfo["password"])}
        for parameter in rest.partition("?")[2].split("&"):
            key, _, value = parameter.partition("=")
            if urllib.parse.unquote(key) in SECRET_KEYS:
                found |= {value, urllib.parse.unquote(value)}
    else:
        found |= {m["value"].strip("'") for m in _KEYWORD.finditer(location)}
    return {secret for secret in found if len(secret) >= SEARCHED_FROM}
