"""The Codex app-server as a process: finding a ``codex`` binary and running ``codex
app-server`` (``process``), and ``tillerman shim``, stdio to the shared server
(``shim``). Imports the core only."""
