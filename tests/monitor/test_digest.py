import hashlib

from tillerman.monitor.digest import Payload, digest, payload, size


def test_digest_of_text_and_bytes():
    expected = "sha256:" + hashlib.sha256("héllo".encode()).hexdigest()
    assert digest("héllo") == digest("héllo".encode()) == expected
    assert size("héllo") == 6


def test_structured_values_are_digested_in_canonical_form():
    assert digest({"b": 1, "a": [1, 2]}) == digest({"a": [1, 2], "b": 1})
    assert digest({"a": 1}) != digest({"a": 2})


def test_text_is_kept_only_when_retained():
    assert payload("secret", retain=False) == Payload(digest("secret"), 6, None)
    assert payload("secret", retain=True) == Payload(digest("secret"), 6, "secret")
