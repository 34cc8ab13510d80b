"""tillerman: an event-sourced intervention controller for AI coding agents.

Its subpackages live in the four folders at the top of the repository and install
under this name (``pyproject.toml`` maps them): ``tillerman.ledger`` (``ledger/``),
``tillerman.rules`` (``rules/``), ``tillerman.monitor`` (``monitor/``) and
``tillerman.controller`` (``controller/``, the daemon and the CLI).
"""
