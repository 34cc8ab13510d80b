"""``tillerman dashboard``: every session on one live local web page, and the owner's
actions on it. The ledger stays the one source of truth: the page reads it as
``status``, ``report`` and ``usage`` do, and its actions append to it through the same
library calls as the CLI (``tillerman.controller.core``), which a running daemon picks
up as it picks up ``tillerman intent propose``.

* ``fleet``: the fleet — one row per thread, those that need a person first (pure).
* ``thread_view``: one thread's page — timeline, turns, approvals, findings, intents
  with their journeys, reviews, usage (pure).
* ``guard``: who may ask — the path derived from the secret, its cookie, Host and
  Origin, CSRF tokens, the Content-Security-Policy (pure checks of a request's headers).
* ``secret``: the secret's 0600 file, so that the page's URLs outlive a restart.
* ``actions``: the page's forms as the CLI's calls — steer, queue, interrupt, stop,
  cancel, resolve a notice, label.
* ``live``: the ledger's change feed as server-sent events.
* ``app``: the Starlette application tying them to routes and templates.

No asset comes from the network: ``static/`` holds htmx, copied unchanged from its npm
package (its license beside it), and the page's own script, which follows ``/events``
and asks htmx for the fragments of what changed. Every link is under the guard's root
path (``base`` in the templates), never a bare ``/``.
"""
