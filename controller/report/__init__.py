"""The account and the timeline of a ledger: the facts folded from its entries (``fold``),
the supervision account (``account``), the account as a SQLite file (``db``) and the
HTML timeline (``timeline``). Imports the core only."""
