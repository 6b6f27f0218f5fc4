// Draws each chart from the JSON the server rendered beside it (the table below holds the same numbers).
"use strict";
const COLORS = ["#3a7bd5", "#e07b39", "#2e9e6a", "#b04fb0", "#c9a227", "#5b6b8c", "#d64545", "#3fb5c4"];

function draw(box, x, lines, stacked, tz) {
  box.replaceChildren();
  const series = [{}];
  const columns = [x];
  // a stack's last line is the total: draw from the top so each fill shows one line's share
  const order = stacked ? [...lines.keys()].reverse() : [...lines.keys()];
  for (const i of order) {
    const color = COLORS[i % COLORS.length];
    series.push({label: lines[i].label, stroke: color, fill: stacked ? color + "55" : undefined,
                 points: {show: !stacked}, value: (u, v) => v == null ? "–" : v.toLocaleString()});
    columns.push(lines[i].values);
  }
  const width = Math.max(260, box.clientWidth - 8);
  // times in the view's zone (UTC unless the local-time toggle chose the browser's), as the table below
  const tzDate = (ts) => uPlot.tzDate(new Date(ts * 1e3), tz);
  const plot = new uPlot({width: width, height: 220, series: series, axes: [{}, {size: 70}], scales: {x: {time: true}},
                          tzDate}, columns, box);
  // keyboard: the arrows, Home and End move the cursor from bucket to bucket; the legend reads out its values
  box.tabIndex = 0;
  box.onkeydown = (event) => {
    const last = x.length - 1;
    const step = {ArrowLeft: -1, ArrowRight: 1}[event.key];
    let idx = plot.cursor.idx;
    if (step) idx = idx == null ? (step > 0 ? 0 : last) : Math.min(last, Math.max(0, idx + step));
    else if (event.key === "Home") idx = 0;
    else if (event.key === "End") idx = last;
    else return;
    event.preventDefault();
    plot.setCursor({left: plot.valToPos(x[idx], "x"), top: plot.bbox.height / devicePixelRatio / 2});
  };
}

function drawCharts(root) {
  const source = (root.querySelector ? root : document).querySelector("[data-chart-data]");
  if (!source || !window.uPlot) return;
  const data = JSON.parse(source.textContent);
  document.querySelectorAll("[data-chart]").forEach((box) => {
    draw(box, data.x, data[box.dataset.chart], box.dataset.stacked === "true", data.tz);
  });
}

// The zone toggle: the browser's own zone (or back to UTC) goes into the URL's tz, and the view reloads in it.
function setZone(button) {
  const zone = button.dataset.zone || Intl.DateTimeFormat().resolvedOptions().timeZone;
  button.form.elements.tz.value = zone;
  button.form.requestSubmit();
}

// The pages hold no inline handler (the Content-Security-Policy allows no inline script): the controls say what
// they do in data attributes, and these listeners on the document serve them, also in content htmx swapped in.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-set-zone]");
  if (button) setZone(button);
});
document.addEventListener("change", (event) => {
  if (event.target.matches("select[data-submit-on-change]")) event.target.form.submit();
});

document.addEventListener("DOMContentLoaded", () => drawCharts(document));
document.addEventListener("htmx:afterSettle", () => drawCharts(document));
