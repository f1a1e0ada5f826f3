/* Static figures: every element with data-figure="<json_script id>" is drawn once from the figure
   embedded in the page (Failures and Checkpoints pages; nothing here polls). */
"use strict";

(function () {
  var config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  var nodes = document.querySelectorAll("[data-figure]");
  for (var i = 0; i < nodes.length; i++) {
    var figure = JSON.parse(document.getElementById(nodes[i].getAttribute("data-figure")).textContent);
    Plotly.newPlot(nodes[i], figure.data, figure.layout, config);
  }
})();
