"""The ledger's exception vocabulary. Backends translate driver errors into these in
exactly one place (their transaction context manager), so callers never catch
``sqlite3`` errors themselves."""


class LedgerError(Exception):
    """Base of everything the ledger raises."""


class OperationalError(LedgerError):
    """The store cannot be written right now (busy, locked, read-only, disk full).

    The daemon stops dispatching while this persists: it never acts without a record.
    """


class AnchorMismatch(OperationalError):
    """The table ends before its head anchor, or the anchor of a ledger that had one is
    missing: rows were cut off the tail (or lost to a power failure). Every write is
    refused, so the daemon holds every dispatch, until a person accepts the shorter
    history (``tillerman ledger accept-tail``)."""


class IntegrityError(LedgerError):
    """The stored chain or sequence is damaged, or a write would damage it."""


class IllegalTransition(LedgerError):
    """An intent transition outside the table; nothing was written."""


class RowsNotKept(LedgerError):
    """The recorder keeps its chain head, not its rows (``Recorder.retains_rows`` is
    False): there is nothing to read back."""


class UnknownIntent(LedgerError):
    """No intent with that id exists in the ledger."""


class SchemaError(LedgerError):
    """The ledger file is from a newer tillerman, or is not a tillerman ledger."""


class LedgerLocked(LedgerError):
    """Another daemon already owns this ledger."""


class Fenced(LedgerError):
    """The caller's thread lease is no longer current (it lapsed, or another daemon took
    the thread): nothing was written, nothing may be sent. The caller reconciles instead
    of dispatching (``tillerman.ledger.leases``)."""


class UnsafeOutput(LedgerError, ValueError):
    """A file may not be written where a person pointed (a FIFO, a device, a directory,
    a ledger or one of its files, a folder that does not exist): nothing was written.
    The message is one line for that person (``tillerman.ledger.paths``)."""
