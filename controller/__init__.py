"""The daemon, intents, the guarded adapter, reconciliation, reports and the CLI."""
