"""Whether the daemon's ledger takes writes. An outage — a database server restarted,
failed over or dropped the connection; a SQLite file busy or unwritable — is said once
when it begins and once when it ends, however many of the daemon's tasks meet it and
however often they retry. The last one is kept for the heartbeat, so ``status`` shows
it. Pure bookkeeping: the daemon logs and retries."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Outage:
    since: float
    error: str  # the first failure's words (credentials already masked by the recorder)
    until: float | None = None  # None: still going on

    def as_dict(self) -> dict:
        return {"since": self.since, "until": self.until, "error": self.error}


class LedgerHealth:
    def __init__(self) -> None:
        self.current: Outage | None = None
        self.last: Outage | None = None  # the latest outage, ended or not

    def failed(self, error: str, now: float) -> bool:
        """A write or read failed for want of the ledger; True when this begins an outage
        (the caller says so, once)."""
        if self.current is not None:
            return False
        self.current = self.last = Outage(now, error)
        return True

    def recovered(self, now: float) -> Outage | None:
        """The ledger answered; the outage this ends (the caller says so, once), or None."""
        if self.current is None:
            return None
        self.current = None
        self.last = replace(self.last, until=now)
        return self.last
