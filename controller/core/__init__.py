"""The pure core: what the controller decides, written once and shared by the daemon,
replay and the wrapper. The delivery machine (``delivery``) and its boundary checks
(``boundary``), restart planning (``reconcile``), app-server refusals read into types
(``rpc_errors``), the decision round the daemon and replay both drive (``round``), one
supervision step (``supervisor``) with each thread's rule triggers
(``watches``) and when the next round is due (``timers``), overdue intents (``overdue``),
intents on request (``intent_requests``, through the recorder interface only), and the
plain values people read: times (``timefmt``), outside text made safe (``printable``),
intents as JSON (``render``). No sockets, processes, files or clocks of its own; it
imports nothing of the controller outside itself."""
