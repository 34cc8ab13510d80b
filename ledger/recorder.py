"""The recorder contract every ledger backend implements (SQLite, PostgreSQL, in memory).

A backend stores ``Envelope``s in one total order (``seq``), chains them with SHA-256,
refuses illegal intent transitions inside the same transaction that would write them,
and translates its driver's errors into ``tillerman.ledger.errors`` in exactly one place.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
from collections.abc import Collection, Iterator, Sequence
from typing import TYPE_CHECKING

import msgspec

from tillerman.ledger import events
from tillerman.ledger.changes import ChangeFeed
from tillerman.ledger.events import Entry, Envelope
from tillerman.ledger.file_offsets import FileOffset

if TYPE_CHECKING:  # for the reader only: they import psycopg and sqlite3, which not every recorder needs
    from tillerman.ledger.leases import Leases
    from tillerman.ledger.wal_checkpoints import BackgroundCheckpoints

GENESIS = "0" * 64
#: The ``row_hash`` formula. A ledger records the version its rows were hashed with
#: (``meta.chain_version``) and is verified under it; a formula change gets a new number
#: and an explicit migration, never a silent re-hash of existing rows.
CHAIN_VERSION = 1


class AppendResult(msgspec.Struct, frozen=True):
    #: The rows written, in order: the entries ``read`` yields for their seqs (the envelope
    #: as stored: ``observed_at`` filled in, a conflict record in place of a changed offer).
    #: A writer folds these instead of reading back what it just wrote.
    entries: tuple[Entry, ...] = ()
    duplicates: int = 0  # identical events already present: silent no-ops
    conflicts: tuple[str, ...] = ()  # event ids offered again with different content

    @property
    def seqs(self) -> tuple[int, ...]:
        return tuple(entry.seq for entry in self.entries)


class VerifyReport(msgspec.Struct, frozen=True):
    ok: bool
    rows: int
    last_seq: int
    problems: tuple[str, ...] = ()  # each names the first bad seq or the anchor mismatch
    notes: tuple[str, ...] = ()  # benign facts (e.g. the anchor lags after a crash)
    chain_version: int = CHAIN_VERSION


def content_digest(env: Envelope, payload: bytes) -> str:
    """What makes two offers of one ``event_id`` the same fact.

    ``observed_at`` is left out on purpose: re-reading a file later observes the same
    fact at another time, and that must stay a silent no-op.
    """
    return _sha256(_encode([env.source, env.at, env.offset, env.length]) + payload).hexdigest()


def row_hash(prev_hash: str, seq: int, env: Envelope, payload: bytes, digest: str) -> str:
    """The chain link: every stored column of the row, bound to the previous hash."""
    head = _encode([seq, env.event_id, env.at, env.observed_at, env.source, digest])
    return _sha256(prev_hash.encode() + head + payload).hexdigest()


_encode = msgspec.json.encode  # module globals: both run twice per appended row
_sha256 = hashlib.sha256


class Recorder(abc.ABC):
    """Append-only, hash-chained event store.

    Beyond the abstract methods every backend implements, what only some backends can do
    is declared here, each with the default a backend without it has: a caller asks the
    interface, never the backend's type. Those capabilities are bulk writes (``bulk``,
    ``load``, ``one_anchor``, ``append_unseen``, ``append_new``), a feed of other
    processes' commits (``change_feed``), history kept outside the live rows
    (``history``), whether a daemon follows the ledger (``daemon_running``), thread leases
    for several daemons on one ledger (``leases``),
    the moving of a write-ahead log into the database off the writer's path
    (``checkpoint_in_background``), and writes off an event loop (``append_off_loop``).
    ``tests/ledger/recorder_contract.py`` holds every backend to them."""

    #: Why the last head-anchor write failed while its rows were committed (a full disk);
    #: None when it succeeded, or for a backend with no anchor file.
    anchor_error: str | None = None

    #: The file the ledger lives in, or ":memory:" (a database ledger: its URL as shown).
    path: str = ":memory:"

    #: Why rows past some point cannot be read (a SQLite file cut mid-page, opened to read
    #: what is left); None for a whole ledger. A command that shows what the ledger holds
    #: refuses such a ledger instead of answering from part of it.
    damage: str | None = None

    #: False for a backend that keeps only its chain head and what de-duplication needs
    #: (``tillerman.ledger.chain_only``): ``append`` works, ``read`` and
    #: ``intent_entries`` raise ``RowsNotKept``. A caller that reads rows back needs True.
    retains_rows: bool = True

    #: True for a backend whose ``append_new`` keeps no id of what it appends (the chain-only
    #: ledger of a replay): only then is it worth a caller's finding out which events are
    #: new and never offered again. False: ``append_new`` is ``append``.
    forgets_new_ids: bool = False

    #: Whether ``append_new`` chains its rows (False: numbered only, ``chain_only.UNCHAINED``).
    chains_new: bool = True

    @abc.abstractmethod
    def append(self, batch: Sequence[Envelope], *, durable: bool = False,
               offsets: Sequence[FileOffset] = ()) -> AppendResult:
        """Write the batch atomically, in order, and return the rows written as entries.
        ``durable`` forces a full fsync (dispatch records must be on disk before the
        transport is called).
        ``offsets``: file tailer positions, stored in the same transaction as the events
        read from those spans (the last one per file identity wins)."""

    def append_unseen(self, batch: Sequence[Envelope]) -> AppendResult:
        """``append`` of events the caller knows no row holds (ids never appended): a
        backend may skip what only a stored id needs. By default, ``append``."""
        return self.append(batch)

    def append_new(self, batch: Sequence[Envelope]) -> AppendResult:
        """``append`` of events the caller knows were never appended and will never be
        offered again (a replay's observations of files each read once): a backend may
        keep no id for them (``forgets_new_ids``). By default, ``append``."""
        return self.append(batch)

    async def append_off_loop(self, batch: Sequence[Envelope], **options) -> AppendResult:
        """``append`` for a caller on an event loop: a recorder that commits on a worker
        thread (the daemon's ``GatedRecorder``) does so there, so that the loop goes on
        while the disk flushes. By default, ``append`` here."""
        return self.append(batch, **options)

    def change_feed(self) -> ChangeFeed | None:
        """What tells this process of every commit to the ledger, by any process
        (``tillerman.ledger.changes``); None for a ledger no other process can write."""
        return None

    def history(self, after_seq: int = 0, kinds: Collection[str] | None = None) -> Iterator[Entry]:
        """Every entry with ``seq > after_seq`` in seq order, rows kept outside the live
        ledger included (a SQLite ledger's archive segments); only those of ``kinds``
        (``events.kind_of``) when given. By default, what ``read`` yields."""
        return (entry for entry in self.read(after_seq)
                if kinds is None or events.kind_of(entry.envelope.event) in kinds)

    def daemon_running(self) -> bool:
        """Whether a daemon follows this ledger now. By default False: only a ledger other
        processes can reach has one."""
        return False

    def leases(self) -> Leases | None:
        """The thread leases several daemons sharing this ledger take (``tillerman.ledger.leases``).
        By default None: one daemon owns such a ledger alone (``tillerman.ledger.lock``)."""
        return None

    def checkpoint_in_background(self) -> BackgroundCheckpoints | None:
        """For a backend with a write-ahead log: move the log into the database on a
        thread of its own from now on, so that no commit waits for it (a daemon's rounds,
        a replay while a forked child parses); returns what runs it. By default there is
        nothing to move: None."""
        return None

    def checkpoint_in_commits(self) -> None:
        """Stop what ``checkpoint_in_background`` started (before a fork: a thread alive
        then would leave its locks held in the child); the commits move the log again."""
        return None

    @contextlib.contextmanager
    def bulk(self) -> Iterator[None]:
        """Appends inside the block share one commit (a replay appends one event at a
        time). Each stays atomic and returns its entries at once; what was appended is
        kept even when the block raises. A backend without commits to save (in memory)
        has nothing to do."""
        yield

    @contextlib.contextmanager
    def load(self) -> Iterator[Recorder]:
        """For a caller that appends only events never appended before and what it
        records itself (a replay of files each named once): the recorder to append
        through inside the block. A backend may write such a load faster on another
        process (``tillerman.ledger.load``); by default it is this one."""
        yield self

    @contextlib.contextmanager
    def one_anchor(self) -> Iterator[None]:
        """Appends inside the block commit one by one, as outside it, but move the head
        anchor once, when the block ends (a backend without an anchor has nothing to do)."""
        yield

    @abc.abstractmethod
    def file_offsets(self) -> list[FileOffset]:
        """Every followed file generation and where it was read up to."""

    @abc.abstractmethod
    def read(self, after_seq: int = 0, limit: int | None = None) -> Iterator[Entry]:
        """Entries with ``seq > after_seq`` in order, never skipping a gap."""

    @abc.abstractmethod
    def max_seq(self) -> int: ...

    @abc.abstractmethod
    def verify(self) -> VerifyReport: ...

    @abc.abstractmethod
    def intent_entries(self, intent_id: str) -> list[Entry]:
        """The creation record and every state/evidence event of one intent."""

    @abc.abstractmethod
    def load_snapshot(self, name: str) -> tuple[int, bytes] | None: ...

    @abc.abstractmethod
    def save_snapshot(self, name: str, seq: int, state: bytes) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def encode_payload(env: Envelope) -> bytes:
    return events.encode(env.event)
