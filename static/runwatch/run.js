/* Run page: draws the three charts from the embedded series, then keeps them and the header
   current from series.json with Plotly.react until the run is finished or failed. */
"use strict";

(function () {
  var charts = document.getElementById("charts");
  var live = document.getElementById("live");
  var liveText = live.querySelector(".live-text");
  var src = charts.getAttribute("data-src");
  var interval = parseInt(charts.getAttribute("data-refresh-ms"), 10) || 3000;
  var config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  var chartIds = { loss: "chart-loss", throughput: "chart-throughput", duration: "chart-duration" };
  var lastOk = Date.now();
  var polling = true;

  function draw(series) {
    Object.keys(chartIds).forEach(function (key) {
      var figure = series.charts[key];
      Plotly.react(chartIds[key], figure.data, figure.layout, config);
    });
  }

  function setField(name, value) {
    var node = document.querySelector('[data-field="' + name + '"]');
    if (node && value !== undefined && value !== null) node.textContent = value;
    return node;
  }

  function updateHeader(series) {
    var run = series.run;
    ["last_step_text", "steps_per_s_text", "tokens_per_s_text", "latest_loss_text",
     "attempts", "world_size", "last_seen_ago"].forEach(function (name) { setField(name, run[name]); });
    var pill = setField("status", run.status);
    pill.className = "pill pill-" + run.status;
    var seen = document.querySelector('[data-field="last_seen_ago"]');
    if (run.last_seen_epoch) seen.setAttribute("data-ago", run.last_seen_epoch);
    seen.title = run.last_seen_exact;
    var note = document.getElementById("ranks-note");
    note.hidden = series.ranks_shown >= series.ranks_total;
    setField("ranks_last", series.ranks_shown - 1);
    setField("ranks_total", series.ranks_total);
    polling = run.polling;
  }

  function showLive() {
    if (!polling) {
      live.setAttribute("data-state", "final");
      liveText.textContent = "Final";
      return;
    }
    var s = Math.floor((Date.now() - lastOk) / 1000);
    live.setAttribute("data-state", s * 1000 > 3 * interval ? "lagging" : "live");
    liveText.textContent = s < 2 ? "Live" : "Live · last update " + s + " s ago";
  }

  // Zooming the throughput chart (the one on a time axis) asks for that window only: the server
  // then draws it from every step instead of per-minute rollups once the window is short.
  var windowQuery = "";

  function epochSeconds(value) {
    if (typeof value === "number") return value / 1000;
    return Date.parse(String(value).replace(" ", "T") + "Z") / 1000;
  }

  function followZoom(event) {
    if (event["xaxis.autorange"]) {
      windowQuery = "";
    } else if (event["xaxis.range[0]"] !== undefined && event["xaxis.range[1]"] !== undefined) {
      var since = epochSeconds(event["xaxis.range[0]"]), until = epochSeconds(event["xaxis.range[1]"]);
      if (!(since < until)) return;
      windowQuery = "?since=" + since.toFixed(3) + "&until=" + until.toFixed(3);
    } else {
      return;
    }
    refresh();
  }

  function refresh() {
    return Runwatch.fetchJson(src + windowQuery).then(function (series) {
      lastOk = Date.now();
      draw(series);
      updateHeader(series);
      showLive();
      return polling;
    }).catch(function (error) {
      live.setAttribute("data-state", "error");
      liveText.textContent = error.message;
      return !error.fatal;
    });
  }

  var initial = JSON.parse(document.getElementById("run-series").textContent);
  draw(initial);
  document.getElementById(chartIds.throughput).on("plotly_relayout", followZoom);
  updateHeader(initial);
  showLive();
  window.setInterval(function () { if (polling && live.getAttribute("data-state") !== "error") showLive(); }, 1000);
  if (polling) Runwatch.poll(refresh, interval);
})();
