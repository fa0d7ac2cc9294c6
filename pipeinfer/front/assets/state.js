// The console's state, shared by its modules: the key, what the server said, the samples.
export const $ = (id) => document.getElementById(id);
export const KEY = "pipeinfer.key";   // where the API key is kept in this browser

export const state = {
  key: localStorage.getItem(KEY) || "", model: $("model").textContent,
  cluster: {}, samples: [], history: [], service: {}, seen: 0,
  latency: { ttft_s: [], itl_buckets_ms: [], itl_counts: [] }, liveDirty: true,
};

// Request headers: `extra`, and the API key if one is given.
export function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (state.key) h.Authorization = "Bearer " + state.key;
  return h;
}

export function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

export function mb(value) {
  if (value == null) return "?";
  return value >= 1024 ? `${(value / 1024).toFixed(1)} GB` : `${Math.round(value)} MB`;
}

// Server-sent events from a fetch body: handle(kind, data) for each event with data.
export async function readEvents(body, handle) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let kind = "message", data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) kind = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) handle(kind, data.join("\n"));
    }
  }
}
