"""Offline replay on a virtual clock: the replayer (``replayer``), which files run together
(``groups``), several files on worker processes (``parallel``), recorded decisions
decided again (``recheck``) and where a candidate rule set acts differently
(``disagreement``). Imports the core and review."""
