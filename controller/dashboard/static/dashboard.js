// The page's live updates: one EventSource on /events; each message names the threads
// and intents that changed and the last ledger seq folded. Only the fragments showing
// them fetch again (htmx, triggered by name): a busy fleet does not reload a quiet
// thread's page. Each fragment's refreshes are serialized by its hx-sync="this:queue last":
// triggers arriving while its request is in flight become one request after it, so a
// burst of changes never piles up requests or swaps an element twice at once.
// No inline script anywhere: the Content-Security-Policy forbids it.
"use strict";
(function () {
  function refresh(change, everything) {
    document.body.dataset.seq = String(change.seq);
    const threads = new Set(change.threads || []), intents = new Set(change.intents || []);
    document.querySelectorAll("[data-live]").forEach(function (el) {
      const kind = el.dataset.live;
      if (everything) {
        htmx.trigger(el, "live-" + kind);
      } else if (kind === "any" && (threads.size || intents.size)) {
        htmx.trigger(el, "live-any");
      } else if (kind === "thread" && threads.has(el.dataset.thread)) {
        htmx.trigger(el, "live-thread");
      } else if (kind === "intent" && intents.has(el.dataset.intent)) {
        htmx.trigger(el, "live-intent");
      }
    });
  }
  function connect() {
    const status = document.getElementById("live-status");
    const source = new EventSource(document.body.dataset.events);
    source.addEventListener("hello", function (event) {
      status.textContent = "live"; status.className = "live on";
      // a stream opened again (the server restarted, the network dropped, or the page fell
      // behind and was cut off): whatever was committed meanwhile was never named, so every
      // live part fetches again once
      const change = JSON.parse(event.data);
      if (change.seq > Number(document.body.dataset.seq)) refresh(change, true);
    });
    source.addEventListener("change", function (event) { refresh(JSON.parse(event.data), false); });
    source.onerror = function () { status.textContent = "reconnecting…"; status.className = "live off"; };
  }
  document.addEventListener("DOMContentLoaded", connect);
})();
