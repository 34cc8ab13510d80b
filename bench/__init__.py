"""Benchmarks that prove the budgets of docs/design.md "Performance budgets" (``make bench``).

Each ``bench_*.py`` module is a small script with ``run(quick: bool) -> list[Row]``;
``python -m bench.run`` runs every one in its own process and prints one table.
"""
