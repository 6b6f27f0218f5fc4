// Draws each chart from the JSON the server rendered beside it (the table below holds the same numbers).
"use strict";
const COLORS = ["#3a7bd5", "#e07b39", "#2e9e6a", "#b04fb0", "#c9a227", "#5b6b8c", "#d64545", "#3fb5c4"];

// Numbers in the reader's locale; axis ticks compact ("2.1M"), so a million never overflows the axis.
const COMPACT = new Intl.NumberFormat(undefined, {notation: "compact", maximumSignificantDigits: 3});
const FULL = new Intl.NumberFormat(undefined, {maximumFractionDigits: 6});

// A value under the pointer as the tables write it: rounded, with its unit ("1,234 ms", "12.3 tok/s", "$1.23").
const UNIT_FORMATS = {
  ms: [new Intl.NumberFormat(undefined, {maximumFractionDigits: 0}), " ms"],
  "tok/s": [new Intl.NumberFormat(undefined, {minimumFractionDigits: 1, maximumFractionDigits: 1}), " tok/s"],
  tokens: [new Intl.NumberFormat(undefined, {maximumFractionDigits: 0}), " tokens"],
  requests: [new Intl.NumberFormat(undefined, {maximumFractionDigits: 0}), ""],
};
const DOLLARS = new Intl.NumberFormat(undefined, {style: "currency", currency: "USD"});
const UNDER_A_CENT = new Intl.NumberFormat(undefined, {style: "currency", currency: "USD", maximumSignificantDigits: 2});
function withUnit(value, unit) {
  if (unit === "USD") return (value === 0 || Math.abs(value) >= 0.01 ? DOLLARS : UNDER_A_CENT).format(value);
  const [format, suffix] = UNIT_FORMATS[unit] || [FULL, ""];
  return format.format(value) + suffix;
}

// Axis text and grid in the page's colours (the stylesheet's, light or dark as the system is).
function theme() {
  const css = getComputedStyle(document.documentElement);
  const ink = css.getPropertyValue("--ink").trim() || "#1d2330";
  const rule = css.getPropertyValue("--rule").trim() || "#e3e5ea";
  return {stroke: ink, grid: {stroke: rule}, ticks: {stroke: rule}};
}

// Bucket starts in seconds; each line holds its own value per bucket. A stacked chart draws running sums
// (each fill shows one model's share) while its legend reads each model's own value.
function draw(box, x, lines, stacked, tz, unit) {
  if (box.plot) box.plot.destroy();  // a redraw (another percentile) drops the old plot's listeners
  box.replaceChildren();
  // times as the tables write them: the legend "2026-11-26 13:00"; an axis tick its day, or its hour in a day
  const [WHEN, DAY, HOUR] = ["{YYYY}-{MM}-{DD} {HH}:{mm}", "{YYYY}-{MM}-{DD}", "{HH}:{mm}"].map(uPlot.fmtDate);
  const empty = !lines.some((line) => line.values.some((v) => v));
  const tzDate = (ts) => uPlot.tzDate(new Date(ts * 1e3), tz);
  const series = [{value: (u, ts) => ts == null ? "–" : WHEN(tzDate(ts))}];
  // each bucket is a step from its start to the next one's; one more point closes the last step
  const end = x.length > 1 ? x[x.length - 1] * 2 - x[x.length - 2] : x[0] + 3600;
  const columns = [x.length ? [...x, end] : x];
  const sums = x.map(() => 0);
  const drawn = lines.map((line) => {
    if (!stacked) return line.values;
    line.values.forEach((v, i) => { sums[i] += v || 0; });
    return [...sums];
  });
  // a stack's top line is the total: draw from the top so each lower fill covers its own share
  const order = stacked ? [...lines.keys()].reverse() : [...lines.keys()];
  // a dashed line (all models together) is grey; the others take the palette in order, as the stacked charts do
  const colorOf = (i) => lines[i].dash ? "#8a8f99" : COLORS[lines.slice(0, i).filter((l) => !l.dash).length % COLORS.length];
  for (const i of order) {
    const color = colorOf(i);
    const own = lines[i].values;
    series.push({label: lines[i].label, stroke: color, fill: stacked ? color + "55" : undefined,
                 dash: lines[i].dash ? [6, 4] : undefined,
                 paths: uPlot.paths.stepped({align: 1, alignGaps: 1}), points: {show: !stacked},
                 value: (u, v, si, idx) => idx == null || own[idx] == null ? "–" : withUnit(own[idx], unit)});
    columns.push(x.length ? [...drawn[i], drawn[i][drawn[i].length - 1]] : drawn[i]);
  }
  const width = chartWidth(box);
  const ticks = (u, splits) => splits.map((ts) => {
    const d = tzDate(ts);
    return d.getHours() || d.getMinutes() ? HOUR(d) : DAY(d);
  });
  // lines (not stacks): the one under the pointer is brought forward and the others fade, legend rows included
  const focus = stacked ? {} : {focus: {alpha: 0.3}, cursor: {focus: {prox: 24}}};
  const plot = new uPlot({width: width, height: 220, series: series, tzDate, padding: [8, 40, 0, 0],  // room for the last tick
                          ...focus,
                          axes: [{values: ticks, space: 90, ...theme()},
                                 {size: (u, values) => 16 + 7 * Math.max(3, ...(values || []).map((v) => v.length)),
                                  values: (u, splits) => splits.map((v) => COMPACT.format(v)), ...theme()}],
                          // from 0, never from the smallest value: a bucket's height is its amount
                          scales: {x: {time: true}, y: {range: (u, min, max) => [0, max > 0 ? max * 1.05 : 1]}}},
                         columns, box);
  box.plot = plot;  // the browser tests read the drawn scales and legend from it
  followWidth(box);
  if (empty) {
    const note = document.createElement("p");
    note.className = "chart-empty";
    note.textContent = "No data in this view.";
    box.append(note);
  }
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

function chartWidth(box) { return Math.max(260, box.clientWidth - 8); }

// A chart follows its box's width (a window resized, a phone turned): the plot is resized, not drawn again.
const resized = new ResizeObserver((entries) => {
  for (const entry of entries) {
    const box = entry.target;
    if (box.plot && Math.abs(box.plot.width - chartWidth(box)) > 1) box.plot.setSize({width: chartWidth(box), height: 220});
  }
});
function followWidth(box) { resized.observe(box); }

function drawCharts(root) {
  const source = (root.querySelector ? root : document).querySelector("[data-chart-data]");
  if (!source || !window.uPlot) return;
  const data = JSON.parse(source.textContent);
  document.querySelectorAll("[data-chart]").forEach((box) => drawChart(box, data));
}

// A chart with a percentile selector holds a set of lines per percentile; it draws the one chosen (also the one a
// reload's restored form state shows).
function drawChart(box, data) {
  const select = document.querySelector(`select[data-percentile-for="${box.dataset.chart}"]`);
  if (select) box.dataset.percentile = select.value;
  const lines = data[box.dataset.chart];
  draw(box, data.x, select ? lines[select.value] : lines, box.dataset.stacked === "true", data.tz,
       (data.units || {})[box.dataset.chart]);
}

function choosePercentile(select) {
  const box = document.querySelector(`[data-chart="${select.dataset.percentileFor}"]`);
  const source = document.querySelector("[data-chart-data]");
  if (box && source && window.uPlot) drawChart(box, JSON.parse(source.textContent));
}

// Numbers in the reader's locale: the browser's own (its language, the first it sends as Accept-Language).
// The server writes them in English with their value beside (data-n, data-money, data-share); an amount under
// a cent keeps two significant digits ("$0.00014").
// A formatter is costly to build (tens of microseconds) and a long view holds thousands of numbers: one per kind.
const FORMATS = new Map();
function formatter(key, options) {
  if (!FORMATS.has(key)) FORMATS.set(key, new Intl.NumberFormat(undefined, options));
  return FORMATS.get(key);
}

function localizeNumbers(root) {
  root.querySelectorAll("[data-n]").forEach((el) => {
    const digits = Number(el.dataset.digits || 0);
    el.textContent = formatter("n" + digits, {minimumFractionDigits: digits, maximumFractionDigits: digits})
      .format(Number(el.dataset.n));
  });
  root.querySelectorAll("[data-share]").forEach((el) => {
    const digits = Number(el.dataset.digits || 0);
    const signed = "signed" in el.dataset;
    el.textContent = formatter(`%${digits}${signed}`, {style: "percent", minimumFractionDigits: digits,
                                                        maximumFractionDigits: digits,
                                                        signDisplay: signed ? "exceptZero" : "auto"})
      .format(Number(el.dataset.share));
  });
  root.querySelectorAll("[data-money]").forEach((el) => {
    const amount = Number(el.dataset.money);
    el.textContent = (amount === 0 || Math.abs(amount) >= 0.01 ? DOLLARS : UNDER_A_CENT).format(amount);
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
  const field = event.target;
  if (field.matches("select[data-submit-on-change]")) field.form.submit();
  if (field.matches("select[data-percentile-for]")) choosePercentile(field);
  // From/To make the range custom; a named range clears them (else the dates would be silently ignored)
  if (field.matches("[data-custom-range]") && field.value) field.form.elements.range.value = "custom";
  if (field.matches("[data-range]") && field.value !== "custom") {
    field.form.querySelectorAll("[data-custom-range]").forEach((input) => { input.value = ""; });
  }
});

// A GET form (the filters) sends only the fields that say something: an empty filter means "all", so it stays out
// of the URL (a link to the view is as short as the view).
document.addEventListener("formdata", (event) => {
  if (event.target.method !== "get") return;
  const data = event.formData;
  for (const name of new Set(data.keys())) {
    const kept = data.getAll(name).filter((value) => value !== "");
    data.delete(name);
    kept.forEach((value) => data.append(name, value));
  }
}, true);

// A page that answered a POST (a new key shown once) takes the plain page's place in the history: a reload
// asks for that page and never posts the form again.
function replaceHistoryEntry() {
  const marked = document.querySelector("[data-replace-url]");
  if (marked) history.replaceState(null, "", marked.dataset.replaceUrl);
}

// timed for bench/dashboard_hourly.py (performance.getEntriesByType("measure"))
function timed(name, work) {
  const started = performance.now();
  work();
  performance.measure(name, {start: started, end: performance.now()});
}

document.addEventListener("DOMContentLoaded", () => {
  replaceHistoryEntry();
  timed("sluice:numbers", () => localizeNumbers(document));
  timed("sluice:charts", () => drawCharts(document));
});
document.addEventListener("htmx:afterSettle", () => { localizeNumbers(document); drawCharts(document); });
