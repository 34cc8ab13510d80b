"""Pure policy (`decide`), detection rules, rule-set files and their lifecycle.

Imports ledger types only; no I/O except loading rule and config files.
"""
