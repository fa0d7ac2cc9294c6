// pipeinfer's web console. Reads GET /api/status, then follows GET /api/events (server-sent
// events read through fetch, so that the API key goes in a header); chats through
// POST /v1/chat/completions like any client (chat.js). No library, no network but this
// server. Modules: state.js (shared state and helpers) <- cluster.js, live.js, chat.js.
import { $, KEY, state, headers, readEvents } from "./state.js";
import { renderCluster, renderHistory, addHistory } from "./cluster.js";
import { addSample, drawLiveIfShown } from "./live.js";
import "./chat.js";

const KEPT = 120;   // samples kept

async function start() {
  let response;
  try {
    response = await fetch("/api/status", { headers: headers(), cache: "no-store" });
  } catch (err) {
    return retry("the server does not answer");
  }
  if (response.status === 401) return askKey();
  if (!response.ok) return retry(`the server answered ${response.status}`);
  $("key-form").hidden = true;
  applyStatus(await response.json());
  follow();
}

async function follow() {
  try {
    const response = await fetch("/api/events", {
      headers: headers({ Accept: "text/event-stream" }), cache: "no-store" });
    if (response.status === 401) return askKey();
    await readEvents(response.body, onEvent);
  } catch (err) { /* the connection went: start again */ }
  retry("connection lost");
}

function retry(why) {
  setService({ state: "offline", reason: why + "; trying again", job: state.service.job });
  setTimeout(start, 2000);
}

function onEvent(kind, data) {
  const obj = JSON.parse(data);
  if (kind === "status") applyStatus(obj);
  else if (kind === "sample") addSample(obj);
  else if (kind === "state") setService(obj);
  else if (kind === "history") addHistory(obj);
  else if (kind === "job") { state.cluster = obj; renderCluster(); }
}

function applyStatus(status) {
  state.cluster = status.cluster || {};
  state.samples = (status.samples || []).slice(-KEPT);
  state.history = status.history || [];
  state.latency = status.latency || state.latency;
  setService(status.service || {});
  renderCluster();
  renderHistory();
  state.liveDirty = true;
  drawLiveIfShown();
}

// --- the API key ----------------------------------------------------------------------
function askKey() {
  const refused = Boolean(state.key);
  state.key = "";
  localStorage.removeItem(KEY);
  setService({ state: "offline", reason: "the API key is needed", job: 0 });
  $("key-message").textContent = refused
    ? "That key was refused: give the server's API key."
    : "This server needs its API key (as given to --api-key). It is kept in this browser.";
  $("key-form").hidden = false;
  $("key-input").focus();
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.key = $("key-input").value.trim();
  localStorage.setItem(KEY, state.key);
  $("key-input").value = "";
  start();
});

// --- the service -------------------------------------------------------------------------
function setService(service) {
  state.service = service;
  const el = $("service");
  el.dataset.state = service.state || "";
  const job = service.job ? `job ${service.job}: ` : "";
  el.textContent = job + (service.state || "?") + (service.reason ? ` (${service.reason})` : "");
  el.title = service.reason || "";
}

// --- the views ----------------------------------------------------------------------------
function showView() {
  const name = (location.hash || "#cluster").slice(1);
  const views = ["cluster", "chat", "live"], shown = views.includes(name) ? name : "cluster";
  for (const v of views) {
    $("view-" + v).hidden = v !== shown;
    const tab = $("tab-" + v);
    if (v === shown) tab.setAttribute("aria-current", "page"); else tab.removeAttribute("aria-current");
  }
  if (shown === "live") { state.liveDirty = true; drawLiveIfShown(); }
}

window.addEventListener("hashchange", showView);
window.addEventListener("resize", () => { state.liveDirty = true; drawLiveIfShown(); });
showView();
start();
