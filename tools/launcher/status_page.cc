#include "tools/launcher/status_page.h"

namespace shoal {

// Data from the job is only ever set as text (textContent / attributes), never parsed as
// HTML, so a job name or host cannot inject markup.
const char* StatusPageHtml() {
  return R"HTML(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>shoal job</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#222;background:#fafafa}
h1{font-size:20px;margin:0 0 4px}
.sub{color:#555;margin-bottom:12px}
table{border-collapse:collapse;background:#fff;margin:8px 0 16px}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#eee}td.l,th.l{text-align:left}
tr.straggler td{background:#fde2e1}
.flag{color:#b3261e;font-weight:bold}
.split{display:inline-flex;width:160px;height:12px;border:1px solid #bbb;vertical-align:middle}
.split span{display:block;height:100%}
.c{background:#4e79a7}.x{background:#f28e2b}.w{background:#bab0ac}
.charts{display:flex;flex-wrap:wrap;gap:16px}
.chart{background:#fff;border:1px solid #ddd;padding:8px}
.chart h2{font-size:14px;margin:0 0 4px}
svg text{font-size:10px;fill:#555}
#facts td{text-align:left}
#error{color:#b3261e}
</style></head>
<body>
<h1 id="title">shoal job</h1>
<div class="sub" id="summary">waiting for /status.json ...</div>
<div id="error"></div>
<table id="workers"><thead><tr><th>rank</th><th class="l">host</th><th class="l">device</th><th>batch</th>
<th>step</th><th>samples/s</th><th>compute ms</th><th>exchange ms</th><th>wait ms</th>
<th class="l">compute / exchange / wait</th><th>slower</th><th class="l">straggler</th><th class="l">state</th></tr></thead>
<tbody id="worker-rows"></tbody></table>
<div class="charts">
<div class="chart"><h2>loss (rank 0)</h2><svg id="loss-chart" width="440" height="220"></svg></div>
<div class="chart"><h2>test accuracy</h2><svg id="acc-chart" width="440" height="220"></svg></div>
</div>
<h2 style="font-size:16px">job</h2>
<table id="facts"><tbody id="fact-rows"></tbody></table>
<script>
"use strict";
const NS = "http://www.w3.org/2000/svg";
function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(NS, tag.slice(4)) : document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function fmt(v, d) { return v === null || v === undefined || Number.isNaN(v) ? "-" : Number(v).toFixed(d); }
function bytes(b) {
  if (b === null || b === undefined) return "-";
  const u = ["B", "KB", "MB", "GB", "TB"]; let i = 0;
  while (b >= 1000 && i < u.length - 1) { b /= 1000; ++i; }
  return b.toFixed(i ? 1 : 0) + " " + u[i];
}
function cell(row, text, cls) { const td = el("td", cls ? {class: cls} : {}, text); row.appendChild(td); return td; }
function split(w) {
  const box = el("span", {class: "split"});
  const parts = [["c", w.compute_ms], ["x", w.exchange_ms], ["w", w.wait_ms]];
  const total = parts.reduce((s, p) => s + (p[1] || 0), 0);
  if (total > 0) for (const [c, v] of parts) {
    const s = el("span", {class: c, title: c === "c" ? "compute" : c === "x" ? "exchange" : "wait"});
    s.style.width = (100 * (v || 0) / total).toFixed(1) + "%"; box.appendChild(s);
  }
  return box;
}
function drawCurve(svg, points, id, color, ymin, ymax) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height"), L = 44, B = 22, T = 8, R = 8;
  svg.appendChild(el("svg:rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#ccc"}));
  if (!points.length) { svg.appendChild(el("svg:text", {x: L + 8, y: T + 16}, "no data yet")); return; }
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = ymin !== undefined ? ymin : Math.min(...ys), y1 = ymax !== undefined ? ymax : Math.max(...ys);
  if (x1 <= x0) x1 = x0 + 1; if (y1 <= y0) { y1 = y0 + 1e-3; y0 -= 1e-3; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
  const d = points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
  svg.appendChild(el("svg:path", {id: id, class: "curve", d: d, fill: "none", stroke: color, "stroke-width": 1.5,
                                  "data-points": points.length}));
  for (const p of points.length < 60 ? points : [])
    svg.appendChild(el("svg:circle", {cx: sx(p[0]), cy: sy(p[1]), r: 2, fill: color}));
  svg.appendChild(el("svg:text", {x: 2, y: T + 10}, y1.toPrecision(3)));
  svg.appendChild(el("svg:text", {x: 2, y: H - B}, y0.toPrecision(3)));
  svg.appendChild(el("svg:text", {x: L, y: H - 6}, x0.toFixed(0) + " s"));
  svg.appendChild(el("svg:text", {x: W - R - 40, y: H - 6}, x1.toFixed(0) + " s"));
}
function render(s) {
  document.getElementById("title").textContent = "shoal job " + s.job;
  document.title = "shoal: " + s.job + " (" + s.state + ")";
  document.getElementById("summary").textContent = s.state + " | " + s.algorithm +
    (s.auto && s.auto.choice ? " (auto chose " + s.auto.choice + ")" : "") + " | epoch " + fmt(s.epoch, 0) +
    " step " + fmt(s.step, 0) + " | loss " + fmt(s.loss, 4) + " | test accuracy " + fmt(s.test_accuracy, 4) +
    " | " + fmt(s.samples_per_s, 0) + " samples/s | " + bytes(s.bytes_sent) + " sent | " + fmt(s.wall_s, 0) + " s";
  const rows = document.getElementById("worker-rows");
  while (rows.firstChild) rows.removeChild(rows.firstChild);
  for (const w of s.workers) {
    const tr = el("tr", {id: "worker-" + w.rank, class: "worker" + (w.straggler ? " straggler" : ""),
                         "data-rank": w.rank, "data-straggler": w.straggler});
    cell(tr, w.rank); cell(tr, w.host, "l"); cell(tr, w.device, "l"); cell(tr, w.batch_size);
    cell(tr, fmt(w.step, 0)); cell(tr, fmt(w.samples_per_s, 0)); cell(tr, fmt(w.compute_ms, 1));
    cell(tr, fmt(w.exchange_ms, 1)); cell(tr, fmt(w.wait_ms, 1));
    cell(tr, "", "l").appendChild(split(w)); cell(tr, w.slower === null ? "-" : fmt(w.slower, 2) + "x");
    const f = cell(tr, w.straggler ? "straggler since step " + w.straggler_since_step : "", "l flag");
    cell(tr, w.state, "l");
    rows.appendChild(tr);
  }
  drawCurve(document.getElementById("loss-chart"), s.curves.loss, "loss-curve", "#4e79a7");
  drawCurve(document.getElementById("acc-chart"), s.curves.test_accuracy, "acc-curve", "#59a14f");
  const facts = document.getElementById("fact-rows");
  while (facts.firstChild) facts.removeChild(facts.firstChild);
  const add = (k, v) => { const tr = el("tr"); tr.appendChild(el("th", {class: "l"}, k)); cell(tr, v, "l"); facts.appendChild(tr); };
  add("algorithm", s.algorithm);
  if (s.auto) for (const k in s.auto)
    if (!["event", "rank"].includes(k)) add("auto " + k, s.auto[k]);
  add("bytes sent", bytes(s.bytes_sent));
  add("last checkpoint", s.checkpoint ? "id " + s.checkpoint.id + " at step " + s.checkpoint.step +
      " (" + fmt(s.checkpoint.wall_s, 0) + " s)" : "none yet");
  add("restarts", s.restarts);
  const scale = (v) => v === null ? "-" : Number.isInteger(Math.log2(v)) ? "2^" + Math.log2(v) : v.toPrecision(4);
  for (const w of s.workers)
    if (w.skipped_steps > 0 || (w.loss_scale !== null && w.loss_scale !== 1))
      add("worker " + w.rank + " loss scale", scale(w.loss_scale) + ", " + fmt(w.skipped_steps, 0) +
          " steps skipped (gradients not finite)");
  const bad = s.workers.reduce((a, w) => a + (w.data_skipped || 0), 0);
  if (bad > 0) add("bad data skipped", fmt(bad, 0) + " (the workers' data_skip lines name each file)");
  add("straggler ratio", s.straggler_ratio + "x the other workers' median time per step");
  for (const c of s.stragglers)
    add("worker " + c.rank, (c.straggler ? "straggler, " + fmt(c.slower, 1) + "x slower" : "keeps up again") +
        " since step " + c.since_step + " (" + fmt(c.since_wall_s, 0) + " s)");
}
let busy = false;
async function poll() {
  if (busy) return; busy = true;
  try {
    const r = await fetch("status.json" + location.search, {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "status unavailable (" + e.message + "); the job may have ended";
  } finally { busy = false; }
}
poll();
setInterval(poll, 1000);
</script>
</body></html>
)HTML";
}

}  // namespace shoal
