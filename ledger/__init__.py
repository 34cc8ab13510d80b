"""Append-only, hash-chained event store; event types; intent state table; folds.

Imports nothing else of tillerman's.
"""
