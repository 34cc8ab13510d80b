"""``tillerman run``: the daemon (``daemon``) and what only it needs — its connection as
``status`` shows it (``link``), its recorder while a round commits on a worker thread
(``ledger_gate``), whether the ledger takes writes (``ledger_health``), reloading rule
and config files (``reload``), ``--metrics`` (``metrics``) and its garbage collector
(``collector``). Imports the core, dispatch, claude, review and notify."""
