"""The integer an event id is looked up by in a SQLite ledger.

An event id is text (``a-`` and 32 hex digits of a natural key's hash, or a readable
key such as ``<intent>:proposed>queued``), and the ledger must refuse a second row with
one: a fact seen twice is a duplicate, a different fact under a stored id a conflict.
A ``UNIQUE`` index on the text itself costs more than the rest of the insert (its
entries are as long as the id, at random places: a 1M-line replay's 470k rows spent
about 16 µs each in it, against 15 µs for everything else). So the ledger keeps a
64-bit key of each id beside it (``id_key``, schema 5), unique, and finds ids through
it: measured on those rows, 32 → 23 µs a row.

Two ids can share a key (at a billion rows, by a chance of about 3 in 100). The second
of them is stored with no key (``NULL``), where a partial unique index on the id itself
(``events_unkeyed``) keeps it unique, and every lookup asks both indexes:
``tillerman.ledger.sqlite`` tells a shared key from a stored id by the id that holds it.
"""

from __future__ import annotations

import hashlib


_SIGN = 1 << 63


def event_key(event_id: str) -> int:
    """The id's key, as SQLite's signed 64-bit integer. Most ids are a letter, a dash and
    32 hex digits of a digest (an app-server fact ``a-…``, a file record ``f-…``, a
    quarantined line ``q-…``): their first 16 digits are the key, read in a fifth of
    the time a digest of the id takes. Any other id: the first 8 bytes of its BLAKE2b
    digest. The key is only ever a shortcut to the id (the id is compared every time),
    so two ids may share one, whichever way each got it."""
    if len(event_id) == 34 and event_id[1] == "-":
        try:
            return int(event_id[2:18], 16) - _SIGN
        except ValueError:
            pass
    return int.from_bytes(hashlib.blake2b(event_id.encode(), digest_size=8).digest(), "big", signed=True)
