"""The ``tillerman`` command line: the main group and its lazy command table (``main``),
what commands share (``shared``), one way to print (``output``), the daemon's log format
(``log_format``), ``status``, and the command groups kept out of ``main`` until they run:
``replay``, ``report``, ``review``, ``rules`` (with the library behind ``rules propose``,
``rule_proposals``) and Claude Code's ``hooks``. The top: it may import every other
sub-package, and none imports it."""
