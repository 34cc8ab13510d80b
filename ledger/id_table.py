"""A compact table of names (event ids, intent ids) to small tags: about 14 bytes per name.

A Python ``set`` or ``dict`` of strings costs well over 100 bytes per entry, and a set of
128-bit ints about 50; a replay of millions of events keeps one entry per event. Here a
name is its 64-bit BLAKE2b digest, stored with a 32-bit tag as a 12-byte record in one of
many small ``bytearray`` buckets, picked by the digest's low bits; a bucket is searched
with ``bytearray.find`` (C speed), and the buckets double when they average
``SPLIT_AT`` records. Between splits a bucket holds 64 to 128 records, so the per-bucket
overhead (about 65 bytes) adds about one byte per record to the twelve.

Two names whose digests are equal are one name: with n names the chance of any such
pair is about n² / 2⁶⁵ (3 × 10⁻⁸ for a million, 3 × 10⁻⁶ for ten million). The digest is
deterministic, so a run that hits one hits it again.

The table is a msgspec Struct, so a projection that holds one (a thread's ended turns,
``tillerman.ledger.projections``) is saved and loaded with it.
"""

from __future__ import annotations

import hashlib

import msgspec

RECORD = 12  # 8 bytes of the name's digest, 4 of its tag
SPLIT_AT = 128  # records per bucket, on average, that double the buckets
_TAG_MAX = 0xFFFF_FFFF


def key_of(name: str) -> bytes:
    """The 64-bit digest a name is stored under."""
    return hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()


_FIRST_BITS = 4  # 16 buckets to start with


class IdTable(msgspec.Struct):
    _bits: int = _FIRST_BITS
    _buckets: list[bytearray] = msgspec.field(default_factory=lambda: [bytearray() for _ in range(1 << _FIRST_BITS)])
    _count: int = 0

    def __len__(self) -> int:
        return self._count

    def get(self, name: str) -> int | None:
        """The tag stored for ``name``, or None."""
        return self.get_key(key_of(name))

    def get_key(self, key: bytes) -> int | None:
        """``get`` of the name whose ``key_of`` is ``key``."""
        bucket = self._bucket(key)
        at = _find(bucket, key)
        return None if at < 0 else int.from_bytes(bucket[at + 8:at + RECORD], "little")

    def put(self, name: str, tag: int) -> None:
        """Store ``tag`` (0 … 2³² − 1) for ``name``, replacing the one it had."""
        key = key_of(name)
        bucket = self._bucket(key)
        at = _find(bucket, key)
        if at >= 0:
            bucket[at + 8:at + RECORD] = _tag_bytes(tag)
            return
        self.add_key(key, tag)

    def add_key(self, key: bytes, tag: int) -> None:
        """Store ``tag`` under ``key``, known to be absent (``get_key`` said None, and it
        was not added since): the bucket is not searched again."""
        self._bucket(key).extend(key + _tag_bytes(tag))
        self._count += 1
        if self._count > SPLIT_AT << self._bits:
            self._split()

    def _bucket(self, key: bytes) -> bytearray:
        return self._buckets[int.from_bytes(key, "little") & ((1 << self._bits) - 1)]

    def _split(self) -> None:
        """Double the buckets: each splits in two by the next bit of its records' digests."""
        bit = 1 << self._bits
        low: list[bytearray] = []
        high: list[bytearray] = []
        for bucket in self._buckets:
            stay, move = bytearray(), bytearray()
            for at in range(0, len(bucket), RECORD):
                record = bucket[at:at + RECORD]
                (move if int.from_bytes(record[:8], "little") & bit else stay).extend(record)
            low.append(stay)
            high.append(move)
        self._buckets = low + high
        self._bits += 1


def _tag_bytes(tag: int) -> bytes:
    if not 0 <= tag <= _TAG_MAX:
        raise ValueError(f"tag {tag} does not fit in 32 bits")
    return tag.to_bytes(4, "little")


def _find(bucket: bytearray, key: bytes) -> int:
    """The offset of ``key``'s record, or -1: a match must start on a record boundary
    (the digest's bytes may also occur across two records, or in a tag)."""
    at = bucket.find(key)
    while at >= 0 and at % RECORD:
        at = bucket.find(key, at + 1)
    return at
