// The cluster view: every host and rank with its layers, memory, CPU and cache; the jobs'
// history.
import { $, state, esc, mb } from "./state.js";

function layersText(rank, total) {
  const l = rank.layers;
  return l ? `layers ${l[0]}\u2013${l[1] - 1} (${l[1] - l[0]} of ${total})` : "no layers";
}

function rankLine(rank, total) {
  return `rank ${rank.rank}: ${rank.role}, ${layersText(rank, total)}, on ${rank.host}`;
}

export function renderCluster() {
  const c = state.cluster, ranks = c.ranks || [];
  if (!ranks.length) {
    $("cluster-text").innerHTML = "<p>No job is up yet: the model is loading.</p>";
    $("cluster-hosts").innerHTML = "";
    return;
  }
  const drafts = c.draft ? `, drafting with ${esc(c.draft)}` : "";
  $("cluster-text").innerHTML =
    `<p>${esc(c.model)}: ${c.n_layer} layers over ${ranks.length} ranks ` +
    `(${esc(c.strategy)}${drafts})</p><ul>` +
    ranks.map((r) => `<li>${esc(rankLine(r, c.n_layer))}</li>`).join("") + "</ul>";
  const hosts = new Map();
  for (const r of ranks) hosts.set(r.host, (hosts.get(r.host) || []).concat([r]));
  $("cluster-hosts").innerHTML = [...hosts].map(([host, list]) =>
    `<div class="host"><h3>${esc(host)} <small>memory ${mb(list[0].memory_limit_mb)}` +
    `</small></h3>${list.map((r) => rankCard(r, c.n_layer)).join("")}</div>`).join("");
  updateRanks(state.samples[state.samples.length - 1] || {});   // (memory: at the start)
}

function rankCard(r, total) {
  const l = r.layers || [0, 0], pct = (x) => (100 * x / Math.max(total, 1)).toFixed(2);
  const cache = r.role === "head" ? "has the model's file"
    : r.role === "draft" ? "loads its draft model itself"
      : r.received_bytes > 0 ? `slice received from rank 0 (${mb(r.received_bytes / 2 ** 20)})`
        : "slice from its own cache";
  const role = r.role === "draft" && r.model ? `draft rank (${esc(r.model)})` : r.role;
  return `<div class="rank" data-rank="${r.rank}">
    <div class="who">rank ${r.rank} \u00b7 ${role}<small>pid ${r.pid}</small></div>
    <div>
      <div class="bar layers" role="img" aria-label="${esc(layersText(r, total))}">
        <span style="left:${pct(l[0])}%;width:${pct(l[1] - l[0])}%"></span></div>
      <div class="facts">${esc(layersText(r, total))} \u00b7 ${cache}</div>
      <div class="bar memory" role="img" aria-label="memory"><span style="width:0"></span></div>
      <div class="facts"><span class="mem"></span> \u00b7 <span class="cpu">CPU ?</span>
        \u00b7 <span class="busy">busy ?</span></div>
    </div></div>`;
}

export function updateRanks(sample) {
  for (const r of state.cluster.ranks || []) {
    const card = document.querySelector(`.rank[data-rank="${r.rank}"]`);
    if (!card) continue;
    const rss = (sample.rss_mb || {})[r.rank] ?? r.rss_mb, limit = r.memory_limit_mb;
    const share = limit ? Math.min(100, 100 * rss / limit) : 0;
    const text = `RSS ${mb(rss)} of ${mb(limit)}`;
    card.querySelector(".mem").textContent = text;
    card.querySelector(".memory").setAttribute("aria-label", text);
    card.querySelector(".memory span").style.width = share.toFixed(1) + "%";
    const cpu = (sample.cpu || {})[r.rank], busy = (sample.busy || {})[r.rank];
    card.querySelector(".cpu").textContent = cpu == null ? "CPU ?" : `CPU ${Math.round(100 * cpu)} %`;
    card.querySelector(".busy").textContent = busy == null ? "busy ?" : `busy ${Math.round(100 * busy)} %`;
  }
}

// --- the job history --------------------------------------------------------------------
function historyText(e) {
  const split = (e.split || []).map(([r, a, b]) => b > a ? `rank ${r}: ${a}\u2013${b - 1}` : `rank ${r}: none`);
  switch (e.name) {
    case "job_start": return [`job ${e.job} starting: ${e.ranks} ranks on ${(e.hosts || []).join(", ")}`, ""];
    case "job_ready": return [`job ${e.job} ready; layers ${split.join(", ")}`, ""];
    case "job_end": return [`job ${e.job} ended: ${e.reason}` +
      (e.failed_rank != null ? ` (rank ${e.failed_rank} blamed)` : ""), e.planned ? "" : "failure"];
    case "recovered": return [`recovered: job ${e.job} took requests ${e.seconds} s after the ` +
      `failure; ${e.requests} request(s) resumed`, "recovered"];
    case "resume": return [`request ${e.request} resumed on job ${e.job} after ${e.sent} tokens`, ""];
    case "host_left": return [`host ${e.host} left (${e.why}); ${e.ranks} ranks now`, "failure"];
    case "host_back": return [`host ${(e.hosts || []).join(", ")} back; ${e.ranks} ranks now`, "recovered"];
    case "stall": return [`job ${e.job} hung: nothing for ${e.quiet_s} s with ${e.requests} request(s) under way`, "failure"];
    case "give_up": return [`gave up: ${e.reason}`, "failure"];
    case "front_stop": return ["the server is stopping", ""];
    default: return [e.name, ""];
  }
}

function historyItem(e) {
  const [text, kind] = historyText(e);
  const when = new Date(e.time * 1000);
  return `<li class="${kind}" data-name="${esc(e.name)}"><time datetime="${when.toISOString()}">` +
    `${when.toLocaleTimeString()}</time>${esc(text)}</li>`;
}

export function renderHistory() {
  $("history").innerHTML = state.history.slice().reverse().map(historyItem).join("");
}

export function addHistory(entry) {
  state.history.push(entry);
  $("history").insertAdjacentHTML("afterbegin", historyItem(entry));
}
