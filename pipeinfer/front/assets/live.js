// The live view: each stage's occupancy, tokens per second, runs, acceptance, latencies,
// drawn when a sample comes and the view is shown (still while the server is idle).
import { $, state, esc } from "./state.js";
import { updateRanks } from "./cluster.js";

const WINDOW_S = 60;                 // the charts' span
const KEPT = 120;                    // samples kept
const TTFT_BINS_S = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const COLORS = { accent: "#4c72b0", spec: "#dd8452", bad: "#c44e52", grid: "#8884" };

export function addSample(sample) {
  state.samples.push(sample);
  if (state.samples.length > KEPT) state.samples.shift();
  state.seen += 1;
  $("view-live").dataset.samples = String(state.seen);
  const lat = state.latency;
  lat.ttft_s = lat.ttft_s.concat(sample.ttft || []).slice(-200);
  lat.itl_counts = (sample.itl || []).map((n, i) => n + (lat.itl_counts[i] || 0));
  updateRanks(sample);
  state.liveDirty = true;
  drawLiveIfShown();
}

export function drawLiveIfShown() {
  if ($("view-live").hidden || !state.liveDirty) return;
  state.liveDirty = false;
  const samples = state.samples, last = samples[samples.length - 1];
  renderFigures(last);
  drawOccupancy($("occupancy"), samples);
  drawSpeed($("speed"), samples);
  drawBars($("ttft"), ttftBins(), TTFT_BINS_S.map((b) => `\u2264${b}`).concat(["more"]));
  drawBars($("itl"), state.latency.itl_counts,
    (state.latency.itl_buckets_ms || []).map((b) => `\u2264${b}`).concat(["more"]));
}

function ttftBins() {
  const counts = new Array(TTFT_BINS_S.length + 1).fill(0);
  for (const s of state.latency.ttft_s) {
    const i = TTFT_BINS_S.findIndex((b) => s <= b);
    counts[i < 0 ? TTFT_BINS_S.length : i] += 1;
  }
  return counts;
}

function median(values) {
  if (!values.length) return null;
  const sorted = values.slice().sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)];
}

function figure(value, label) {
  return `<div class="figure"><b>${esc(value)}</b><span>${esc(label)}</span></div>`;
}

function renderFigures(last) {
  const c = state.cluster, predicted = c.predicted && c.predicted.tokens_per_s;
  const perRequest = last ? Object.values(last.requests || {}) : [];
  const ttft = median(state.latency.ttft_s);
  const busiest = last ? Object.entries(last.busy || {}).sort((a, b) => b[1] - a[1])[0] : null;
  $("live-figures").innerHTML = [
    figure(last ? last.tokens_per_s.toFixed(1) : "\u2013", "tokens/s, all requests (last second)"),
    figure(perRequest.length ? Math.max(...perRequest).toFixed(1) : "\u2013", "tokens/s, fastest request"),
    figure(predicted ? predicted.toFixed(1) : "no profile", plannerLabel(c.predicted)),
    figure(last ? `${last.running} / ${last.waiting}` : "\u2013", "requests running / waiting"),
    figure(last ? String(last.in_flight) : "\u2013", "runs in flight"),
    figure(busiest ? `rank ${busiest[0]}: ${Math.round(100 * busiest[1])} %` : "\u2013", "busiest stage"),
    figure(ttft == null ? "\u2013" : `${Math.round(1000 * ttft)} ms`, "median time to first token"),
  ].join("");
  $("live-figures").dataset.at = last ? String(last.t) : "";
  renderTables(last);
}

// What the planner's figure is: its prediction of one request's speed (iterative: the sum
// of stage times), or a bound (pipelined speculation: the slowest stage, every draft taken).
function plannerLabel(predicted) {
  if (!predicted) return "planner's prediction (--layer-split auto)";
  return predicted.bound === "sum" ? "planner's predicted tokens/s per request"
    : "planner's bound, tokens/s (every draft accepted)";
}

function renderTables(last) {
  const rates = (last && last.rates) || {}, totals = (last && last.totals) || {};
  const row = (cells) => `<tr>${cells.map((c, i) => i ? `<td>${esc(c)}</td>` : `<th scope="row">${esc(c)}</th>`).join("")}</tr>`;
  const head = (cells) => `<tr>${cells.map((c) => `<th scope="col">${esc(c)}</th>`).join("")}</tr>`;
  const n = (v) => (v == null ? "\u2013" : String(Math.round(v * 10) / 10));
  $("runs").innerHTML = head(["", "per second", "since the job started"]) +
    row(["started", n(rates.runs_started), n(totals.runs_started)]) +
    row(["cancelled", n(rates.runs_cancelled), n(totals.runs_cancelled)]) +
    row(["aborted midway", n(rates.runs_aborted), n(totals.runs_aborted)]) +
    row(["drafted tokens accepted", n(rates.accepted), n(totals.accepted)]);
  const share = (a, d) => d ? `${a} / ${d} (${Math.round(100 * a / d)} %)` : "none drafted";
  const model = [(totals.accepted || 0) - (totals.accepted_ngram || 0), (totals.drafted || 0) - (totals.drafted_ngram || 0)];
  $("acceptance").innerHTML = head(["source", "accepted / drafted"]) +
    row(["draft model", share(model[0], model[1])]) +
    row(["n-gram", share(totals.accepted_ngram || 0, totals.drafted_ngram || 0)]) +
    row(["grammar", `${totals.drafted_free || 0} forced, ${totals.drafts_cut || 0} cut`]);
  const requests = Object.entries((last && last.requests) || {});
  $("requests").innerHTML = head(["request", "tokens/s"]) + (requests.length
    ? requests.map(([rid, tps]) => row([`#${rid}`, tps.toFixed(1)])).join("") : row(["none", ""]));
}

function canvas2d(canvas) {
  const ratio = window.devicePixelRatio || 1, width = canvas.clientWidth || 600;
  const height = Number(canvas.getAttribute("height")) || 120;
  if (canvas.width !== Math.round(width * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.height = height + "px";
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = getComputedStyle(document.body).color;
  return [ctx, width, height];
}

function timeAxis(ctx, left, width, height) {
  ctx.strokeStyle = COLORS.grid;
  ctx.textAlign = "center";
  for (const s of [60, 45, 30, 15, 0]) {
    const x = left + (width - left) * (1 - s / WINDOW_S);
    ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, height - 14); ctx.stroke();
    ctx.fillText(s ? `-${s} s` : "last", Math.min(Math.max(x, left + 14), width - 14), height - 3);
  }
}

function drawOccupancy(canvas, samples) {
  const [ctx, width, height] = canvas2d(canvas), left = 86;
  const ranks = (state.cluster.ranks || []).filter((r) => r.role !== "draft");
  const rowH = (height - 18) / Math.max(ranks.length, 1);
  ranks.forEach((r, i) => {
    ctx.textAlign = "left";
    ctx.fillText(`rank ${r.rank} ${r.role}`, 2, i * rowH + rowH / 2 + 4);
  });
  const last = samples.length ? samples[samples.length - 1].t : 0;
  const x = (t) => left + (width - left) * (1 - (last - t) / WINDOW_S);
  const words = [];
  for (const s of samples) {
    if (last - s.t > WINDOW_S) continue;
    ranks.forEach((r, i) => {
      const busy = (s.busy || {})[r.rank] || 0;
      ctx.fillStyle = `rgba(76,114,176,${0.08 + 0.92 * busy})`;
      const x0 = Math.max(x(s.t - s.span), left), x1 = x(s.t);
      ctx.fillRect(x0, i * rowH + 2, Math.max(x1 - x0 - 1, 1), rowH - 4);
    });
  }
  ctx.fillStyle = getComputedStyle(document.body).color;
  timeAxis(ctx, left, width, height);
  if (samples.length) {
    const s = samples[samples.length - 1];
    for (const r of ranks) words.push(`rank ${r.rank} ${Math.round(100 * ((s.busy || {})[r.rank] || 0))} % busy`);
  }
  canvas.setAttribute("aria-label", `Occupancy in the last sample: ${words.join(", ") || "no samples yet"}`);
}

function drawSpeed(canvas, samples) {
  const [ctx, width, height] = canvas2d(canvas), left = 40;
  const predicted = state.cluster.predicted && state.cluster.predicted.tokens_per_s;
  const recent = samples.filter((s) => samples[samples.length - 1].t - s.t <= WINDOW_S);
  const top = Math.max(1, predicted || 0, ...recent.map((s) => s.tokens_per_s)) * 1.15;
  const last = samples.length ? samples[samples.length - 1].t : 0;
  const x = (t) => left + (width - left) * (1 - (last - t) / WINDOW_S);
  const y = (v) => (height - 16) * (1 - v / top) + 2;
  ctx.textAlign = "right";
  for (const v of [0, top / 2, top]) ctx.fillText(v.toFixed(0), left - 4, y(v) + 4);
  timeAxis(ctx, left, width, height);
  if (predicted) {
    ctx.strokeStyle = COLORS.spec; ctx.setLineDash([5, 4]);
    ctx.beginPath(); ctx.moveTo(left, y(predicted)); ctx.lineTo(width, y(predicted)); ctx.stroke();
    ctx.setLineDash([]); ctx.textAlign = "left"; ctx.fillStyle = COLORS.spec;
    const bound = state.cluster.predicted.bound === "sum" ? "prediction" : "bound";
    ctx.fillText(`planner's ${bound}`, left + 4, y(predicted) - 4);
  }
  ctx.strokeStyle = COLORS.accent; ctx.lineWidth = 2; ctx.beginPath();
  recent.forEach((s, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, x(s.t), y(s.tokens_per_s)));
  ctx.stroke(); ctx.lineWidth = 1;
  const now = recent.length ? recent[recent.length - 1].tokens_per_s : 0;
  canvas.setAttribute("aria-label", `Tokens per second: ${now} in the last sample` +
    (predicted ? `; the planner predicted ${predicted}` : ""));
}

function drawBars(canvas, counts, labels) {
  const [ctx, width, height] = canvas2d(canvas);
  const n = Math.max(counts.length, 1), most = Math.max(1, ...counts), w = width / n;
  counts.forEach((c, i) => {
    const h = (height - 28) * c / most;
    ctx.fillStyle = COLORS.accent;
    ctx.fillRect(i * w + 3, height - 16 - h, w - 6, h);
    ctx.fillStyle = getComputedStyle(document.body).color;
    ctx.textAlign = "center";
    if (c) ctx.fillText(String(c), i * w + w / 2, height - 20 - h);
    if (w >= 40 || i % 2 === 0) ctx.fillText(labels[i] || "", i * w + w / 2, height - 3);
  });
  canvas.setAttribute("aria-label", counts.map((c, i) => `${labels[i]}: ${c}`).join(", "));
}
