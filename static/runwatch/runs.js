/* Runs list: replaces the table body with fresh rows from runs.json every refresh interval. */
"use strict";

(function () {
  var table = document.getElementById("runs-table");
  var empty = document.getElementById("runs-empty");
  var holder = table || empty;
  var state = document.getElementById("refresh-state");
  if (!holder) return;
  var src = holder.getAttribute("data-src");
  var interval = parseInt(holder.getAttribute("data-refresh-ms"), 10) || 3000;
  var lastOk = Date.now();

  function refresh() {
    return Runwatch.fetchJson(src).then(function (payload) {
      lastOk = Date.now();
      if (!table) {
        // The first run arrived while the empty state was showing: draw the table once.
        if (payload.runs.length) window.location.reload();
        return true;
      }
      document.getElementById("runs-body").innerHTML = payload.rows_html;
      state.textContent = "Updated just now";
      state.classList.remove("error");
      return true;
    }).catch(function (error) {
      state.textContent = error.message;
      state.classList.add("error");
      return !error.fatal;
    });
  }

  window.setInterval(function () {
    if (state.classList.contains("error")) return;
    var s = Math.floor((Date.now() - lastOk) / 1000);
    if (s >= 2) state.textContent = "Updated " + s + " s ago";
  }, 1000);
  Runwatch.poll(refresh, interval);
})();
