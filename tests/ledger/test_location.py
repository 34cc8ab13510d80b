"""``shown``: the one function a ledger's location or a database's error goes through
before a person, a log or ``status`` sees it. Every form libpq takes a secret in."""

from __future__ import annotations

import pytest

from tillerman.ledger.location import shown

SECRET = "s3kr1t"

#: (a location holding SECRET, how it is shown)
FORMS = [
    ("postgresql://alice:s3kr1t@db.internal/tm", "postgresql://alice:***@db.internal/tm"),
    ("postgres://alice:s3kr1t@db.internal:5433/tm", "postgres://alice:***@db.internal:5433/tm"),
    ("postgresql://alice@db.internal/tm?password=s3kr1t", "postgresql://alice@db.internal/tm?password=***"),
    ("postgresql://alice@/tm?host=/run/pg&password=s3kr1t&sslmode=disable",
     "postgresql://alice@/tm?host=/run/pg&password=***&sslmode=disable"),
    ("postgresql://alice@h/tm?sslpassword=s3kr1t", "postgresql://alice@h/tm?sslpassword=***"),
    # percent-encoded: the key (libpq decodes it), the value, the userinfo
    ("postgresql://alice@h/tm?pass%77ord=s3kr1t", "postgresql://alice@h/tm?pass%77ord=***"),
    ("postgresql://alice@h/tm?password=s3%6Br1t", "postgresql://alice@h/tm?password=***"),
    ("postgresql://alice:s3%6Br1t@h/tm", "postgresql://alice:***@h/tm"),
    # several hosts: the userinfo before all of them
    ("postgresql://alice:s3kr1t@h1:5432,h2:5433/tm?target_session_attrs=read-write",
     "postgresql://alice:***@h1:5432,h2:5433/tm?target_session_attrs=read-write"),
    ("postgresql://h1,h2/tm?password=s3kr1t&user=alice", "postgresql://h1,h2/tm?password=***&user=alice"),
    # raw characters libpq takes in a password that a URL parser would split at
    ("postgresql://alice:s3kr1t#x@h/tm", "postgresql://alice:***@h/tm"),
    ("postgresql://alice:s3kr1t?x@h/tm", "postgresql://alice:***@h/tm"),
    ("postgresql://alice:s3kr1t x@h/tm", "postgresql://alice:***@h/tm"),
    ("postgresql://alice:s3@kr1t@h/tm", "postgresql://alice:***@h/tm"),
    ("postgresql://alice:s3/kr1t@h/tm", "postgresql://alice:***@h/tm"),
    ("postgresql://alice@h/tm?password=s3kr1t x&user=a", "postgresql://alice@h/tm?password=***&user=a"),
    # key=value conninfo
    ("host=h user=alice password=s3kr1t dbname=tm", "host=h user=alice password=*** dbname=tm"),
    ("host=h password = 's3kr1t \\' x' dbname=tm", "host=h password = *** dbname=tm"),
    ("host=h sslpassword=s3kr1t", "host=h sslpassword=***"),
]


@pytest.mark.parametrize(("location", "expected"), FORMS)
def test_every_credential_form_is_masked(location, expected):
    assert shown(location) == expected and SECRET not in shown(location)


@pytest.mark.parametrize("location", ["postgresql://alice@db.internal/tm", "postgresql://postgres@/t?host=/tmp/s",
                                      "postgres://h1:5432,h2:5433/tm?sslmode=require"])
def test_a_location_without_a_secret_is_shown_as_given(location):
    assert shown(location) == location


@pytest.mark.parametrize("message", [
    'invalid percent-encoded token: "s3kr1t%zz"',  # libpq quotes the token it could not decode
    'missing "=" after "s3kr1t" in connection info string',
    "connection failed: password=s3kr1t rejected",
])
def test_a_message_about_a_database_never_quotes_its_secret(message):
    dsn = "postgresql://alice:s3kr1t%zz@h/tm" if "%zz" in message else "postgresql://alice:s3kr1t@h/tm"
    assert SECRET not in shown(message, dsn)


def test_pgpassword_is_never_shown(monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "from-the-environment")
    assert shown("could not connect: from-the-environment", "postgresql://alice@h/tm") == "could not connect: ***"
    assert "from-the-environment" not in shown("postgresql://alice@h/tm?application_name=from-the-environment")
