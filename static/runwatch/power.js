/* Power page: when the user zooms the cluster power chart, fetch that range again from the server
   (per second once the range is short enough) and redraw both charts; double-click resets. */
"use strict";

(function () {
  var script = document.currentScript;
  var url = script.getAttribute("data-url");
  var chart = document.getElementById("chart-power");
  var histogram = document.getElementById("chart-histogram");
  if (!chart || !url) { return; }
  var pending = null;

  function toSeconds(value) {
    // Plotly reports a zoomed date axis as "YYYY-MM-DD HH:MM:SS.sss" strings in UTC (our axis is
    // epoch ms in UTC); a range set from code may be ISO with its zone, or a number.
    if (typeof value === "number") { return value / 1000; }
    var text = String(value).replace(" ", "T");
    return Date.parse(/(Z|[+-]\d\d:?\d\d)$/.test(text) ? text : text + "Z") / 1000;
  }

  function load(query) {
    if (pending) { pending.abort(); }
    pending = new AbortController();
    fetch(url + query, { credentials: "same-origin", signal: pending.signal })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) {
        if (!body || body.empty) { return; }
        var keep = chart.layout.xaxis.range;
        var figure = body.figures.power;
        if (query) { figure.layout.xaxis.range = keep; figure.layout.xaxis.autorange = false; }
        Plotly.react(chart, figure.data, figure.layout);
        Plotly.react(histogram, body.figures.histogram.data, body.figures.histogram.layout);
        chart.setAttribute("data-mode", body.method.per_minute ? "per-minute" : "per-second");
      })
      .catch(function () { /* a superseded request, or the server away: keep what is drawn */ });
  }

  function wire() {
    if (!chart.on) { setTimeout(wire, 50); return; }
    chart.on("plotly_relayout", function (change) {
      if (change["xaxis.autorange"]) { load(""); return; }
      var lo = change["xaxis.range[0]"], hi = change["xaxis.range[1]"];
      if (lo === undefined && change["xaxis.range"]) { lo = change["xaxis.range"][0]; hi = change["xaxis.range"][1]; }
      if (lo === undefined || hi === undefined) { return; }
      load("?start=" + toSeconds(lo).toFixed(0) + "&end=" + toSeconds(hi).toFixed(0));
    });
  }
  wire();
})();
