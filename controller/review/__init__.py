"""Reviewers at named checkpoints: the packet for an intent (``packet``), asking a
configured reviewer command (``reviewer``), and when the daemon and replay ask and what
an answer leads to (``checkpoints``). Imports the core only."""
