"""Carrying out what the core decided: the guarded adapter, the only code that sends
an intervention (``adapter``), the driver loop between a delivery machine, the ledger and
the adapter (``driver``), the thread leases that fence a dispatch when several daemons
share a ledger (``leases_keeper``). Imports the core only."""
