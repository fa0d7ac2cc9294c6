// The chat: a conversation through /v1/chat/completions, streamed, as any client sends it.
import { $, state, esc, headers, readEvents } from "./state.js";

const chat = { messages: [], controller: null };

function renderMarkdown(text) {
  const out = [], fence = /```([^\n`]*)\n?([\s\S]*?)(?:```|$)/g;
  let at = 0, m;
  const prose = (t) => t.split(/\n{2,}/).filter((p) => p.trim()).map((p) => "<p>" + esc(p)
    .replace(/`([^`\n]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>") + "</p>").join("");
  while ((m = fence.exec(text)) !== null) {
    out.push(prose(text.slice(at, m.index)));
    const lang = m[1].trim();
    out.push(`<pre><code${lang ? ` class="language-${esc(lang)}"` : ""}>${esc(m[2])}</code></pre>`);
    at = fence.lastIndex;
    if (m[0].length === 0) break;
  }
  out.push(prose(text.slice(at)));
  return out.join("");
}

function addMessage(role, text) {
  const el = document.createElement("article");
  el.className = "msg " + role;
  el.setAttribute("aria-label", role === "user" ? "You" : "Answer");
  if (role === "user") el.textContent = text;
  else el.innerHTML = `<div class="body"></div><div class="stats"></div>`;
  $("chat-log").appendChild(el);
  return el;
}

function number(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  const body = { model: state.model, messages: messages.concat(chat.messages), stream: true,
    stream_options: { include_usage: true }, temperature: number("temperature"),
    top_p: number("top_p"), max_tokens: number("max_tokens") };
  if (number("seed") !== undefined) body.seed = number("seed");
  return body;
}

function answerStats(a) {
  const parts = [];
  const n = a.usage ? a.usage.completion_tokens : (a.timings ? a.timings.predicted_n : null);
  if (n != null) parts.push(`${n} tokens`);
  if (a.first != null && a.last > a.first && n > 1) parts.push(`${((n - 1) / ((a.last - a.first) / 1000)).toFixed(1)} t/s`);
  if (a.first != null) parts.push(`TTFT ${Math.round(a.first - a.sent)} ms`);
  const d = a.timings && a.timings.drafts;
  if (d) {
    const src = (name, s) => s.drafted ? `${name} ${s.accepted}/${s.drafted}` : null;
    const by = [src("model", d.model), src("n-gram", d.ngram)].filter(Boolean);
    if (d.grammar && d.grammar.forced) by.push(`grammar ${d.grammar.forced} forced`);
    parts.push(by.length ? `accepted/drafted: ${by.join(", ")}` : "no drafts");
  }
  if (a.stopped) parts.push("stopped");
  else if (a.finish === "length") parts.push("cut at max tokens");
  return parts.join(" \u00b7 ");
}

async function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.controller) return;
  chat.messages.push({ role: "user", content: text });
  addMessage("user", text);
  $("prompt").value = "";
  const el = addMessage("assistant", ""), body = el.querySelector(".body");
  const a = { raw: "", sent: performance.now(), first: null, last: null, usage: null,
    timings: null, finish: null, stopped: false };
  el.dataset.done = "false";
  chat.controller = new AbortController();
  $("send").disabled = true; $("stop").disabled = false;
  let pending = false;
  const show = () => { pending = false; body.innerHTML = renderMarkdown(a.raw); el.dataset.raw = a.raw; };
  try {
    const response = await fetch("/v1/chat/completions", { method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(requestBody()), signal: chat.controller.signal });
    if (!response.ok) {
      const err = await response.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || `HTTP ${response.status}`);
    }
    await readEvents(response.body, (kind, data) => {
      if (data === "[DONE]") return;
      const obj = JSON.parse(data);
      if (obj.error) throw new Error(obj.error.message);
      for (const c of obj.choices || []) {
        const piece = c.delta && c.delta.content;
        if (piece) {
          const now = performance.now();
          if (a.first === null) a.first = now;
          a.last = now;
          a.raw += piece;
          if (!pending) { pending = true; requestAnimationFrame(show); }
        }
        if (c.finish_reason) a.finish = c.finish_reason;
      }
      if (obj.timings) a.timings = obj.timings;
      if (obj.usage) a.usage = obj.usage;
    });
  } catch (err) {
    if (err.name === "AbortError") a.stopped = true;
    else { el.classList.add("error"); a.error = err.message; }
  }
  show();
  el.querySelector(".stats").textContent = a.error ? `error: ${a.error}` : answerStats(a);
  el.dataset.done = "true";
  chat.messages.push({ role: "assistant", content: a.raw });
  chat.controller = null;
  $("send").disabled = false; $("stop").disabled = true;
}

$("chat-form").addEventListener("submit", send);
$("stop").addEventListener("click", () => chat.controller && chat.controller.abort());
$("new-chat").addEventListener("click", () => {
  if (chat.controller) chat.controller.abort();
  chat.messages = [];
  $("chat-log").innerHTML = "";
  $("prompt").focus();
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("chat-form").requestSubmit();
});
