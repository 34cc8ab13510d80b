"""Claude Code: the hook Claude Code runs (``hook``; installed settings name the stable
``tillerman.controller.claude_hook``), its entries in ``settings.json`` (``settings``),
delivery through the hooks — the per-session outbox (``hook_outbox``), the hook's claim
(``hook_claim``) and the daemon's side (``hook_delivery``) — and ``tillerman claude``, the
stream-json wrapper (``wrapper``) with its relay state without I/O (``relay``). Imports
the core and dispatch."""
