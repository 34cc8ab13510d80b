"""The daemon, intents, the guarded adapter, reconciliation, reports and the CLI, in
sub-packages named after what they hold. Arrows run one way (tests/test_layering.py):
``core`` (pure) ← ``dispatch`` ← ``claude``; ``core`` ← ``review`` ← ``replay``;
``core`` ← ``notify``, ``report``, ``codex``; ``daemon`` over core, dispatch, claude,
review and notify; ``cli`` over all of them. Here at the top stay only the entry modules
people run by path: ``__main__`` and ``claude_hook``."""
