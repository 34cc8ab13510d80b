"""An event id's key (``tillerman.ledger.event_keys``): the same in every process, within
SQLite's signed 64-bit range, and spread, whichever form the id has."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from tillerman.ledger.event_keys import event_key

INT64 = range(-(1 << 63), 1 << 63)


@given(st.text())
def test_every_id_has_a_key_in_sqlites_integer_range(event_id):
    assert event_key(event_id) in INT64


def test_a_digest_id_is_keyed_by_its_first_16_digits_and_any_other_by_a_digest():
    assert event_key("a-" + "f" * 16 + "0" * 16) == (1 << 63) - 1
    assert event_key("f-" + "0" * 32) == -(1 << 63)
    assert event_key("a-zz" + "0" * 30) == event_key("a-zz" + "0" * 30)  # not hex: digested, still stable
    keys = {event_key(f"in-{i:020d}:proposed>queued") for i in range(10_000)}
    assert len(keys) == 10_000


def test_the_key_is_the_same_in_another_process():
    ids = ["a-" + "0123456789abcdef" * 2, "in-00000000000000000001:proposed>queued", "tail_accepted:3:ab:1.5"]
    out = subprocess.run([sys.executable, "-c", "import sys; from tillerman.ledger.event_keys import event_key;"
                          " print([event_key(i) for i in sys.argv[1:]])", *ids],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == str([event_key(i) for i in ids])
