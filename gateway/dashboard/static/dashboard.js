// Draws each chart from the JSON the server rendered beside it (the table below it holds the same numbers).
"use strict";
const COLORS = ["#3a7bd5", "#e07b39", "#2e9e6a", "#b04fb0", "#c9a227", "#5b6b8c", "#d64545", "#3fb5c4"];

function drawTokens(box, data) {
  box.replaceChildren();
  const series = [{}];
  const columns = [data.x];
  // the last model's line is the total: draw from the top so each fill shows one model's share
  [...data.stacked].reverse().forEach((s, i) => {
    const color = COLORS[(data.stacked.length - 1 - i) % COLORS.length];
    series.push({label: s.model, stroke: color, fill: color + "55", points: {show: false},
                 value: (u, v, si, idx) => v == null ? "–" : v.toLocaleString()});
    columns.push(s.tokens);
  });
  const width = Math.max(280, box.clientWidth);
  new uPlot({width: width, height: 240, series: series, axes: [{}, {size: 70}],
             scales: {x: {time: true}}, legend: {live: true}}, columns, box);
}

function drawCharts(root) {
  root.querySelectorAll("[data-chart=tokens]").forEach((box) => {
    const source = box.parentElement.querySelector("[data-chart-data=tokens]");
    if (source && window.uPlot) drawTokens(box, JSON.parse(source.textContent));
  });
}

document.addEventListener("DOMContentLoaded", () => drawCharts(document));
document.addEventListener("htmx:afterSettle", (event) => drawCharts(event.detail.elt || document));
