/* Shared helpers for Runwatch pages: relative times and polling JSON endpoints. */
"use strict";

window.Runwatch = (function () {
  function ago(epochSeconds) {
    var s = Math.max(0, Math.floor(Date.now() / 1000 - epochSeconds));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h ago";
    return Math.floor(s / 86400) + " d ago";
  }

  // Server-rendered "12 s ago" goes stale between refreshes; re-derive it from the timestamp.
  function tickAgo() {
    var nodes = document.querySelectorAll("[data-ago]");
    for (var i = 0; i < nodes.length; i++) {
      nodes[i].textContent = ago(parseFloat(nodes[i].getAttribute("data-ago")));
    }
  }

  // A session that expired answers with the login page, not JSON: say so instead of failing
  // silently on every tick.
  function fetchJson(url) {
    return fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (response) {
        var type = response.headers.get("Content-Type") || "";
        if (response.redirected || type.indexOf("application/json") === -1) {
          var error = new Error("Your session has ended: reload the page to log in again.");
          error.fatal = true;
          throw error;
        }
        if (!response.ok) throw new Error("The server answered " + response.status + "; retrying.");
        return response.json();
      });
  }

  // Calls fn every intervalMs, waiting for each call to finish so slow answers never pile up.
  // fn returns a promise resolving to false to stop.
  function poll(fn, intervalMs) {
    function next() {
      window.setTimeout(function () {
        fn().then(function (keepGoing) { if (keepGoing !== false) next(); });
      }, intervalMs);
    }
    next();
  }

  window.setInterval(tickAgo, 1000);
  return { ago: ago, tickAgo: tickAgo, fetchJson: fetchJson, poll: poll };
})();
