"""The console's page and its few files (assets/: console.html and .css; the script's
modules console.js <- state.js, cluster.js, live.js, chat.js; no other network at run
time): the page is console.html with the cluster written in as text when the server needs
no key (so it reads, with or without script, as soon as it opens); with --api-key the page
holds no data and asks for the key, and its script reads everything through /api/status and
/api/events with it."""

from __future__ import annotations

import html
from importlib import resources

SCRIPT = "text/javascript; charset=utf-8"
ASSETS = {"console.css": "text/css; charset=utf-8", "console.js": SCRIPT, "state.js": SCRIPT,
          "cluster.js": SCRIPT, "live.js": SCRIPT, "chat.js": SCRIPT}
CLUSTER_MARK = "<!-- cluster -->"
NO_JOB = "<p>No job is up yet: the model is loading.</p>"


def asset(name: str) -> bytes | None:
    """One of the page's files (None if it is not one)."""
    if name not in ASSETS and name != "console.html":
        return None
    return resources.files(__package__).joinpath("assets", name).read_bytes()


def page(cluster: dict | None, model: str) -> str:
    """The page: `cluster` (the job's layout, console.cluster()) written in as text, or
    None when the reader must give the key first."""
    text = asset("console.html").decode()
    text = text.replace("{{model}}", html.escape(model))
    if cluster is None:
        return text.replace(CLUSTER_MARK, "")
    return text.replace(CLUSTER_MARK, cluster_text(cluster))


def cluster_text(cluster: dict) -> str:
    """Each rank's number, role, host and layers, and the model's layers, as a list."""
    ranks = cluster.get("ranks") or []
    if not ranks:
        return NO_JOB
    total = cluster.get("n_layer", 0)
    items = "".join(f"<li>{html.escape(rank_line(r, total))}</li>" for r in ranks)
    return (f'<p>{html.escape(cluster.get("model", ""))}: {total} layers over '
            f"{len(ranks)} ranks</p><ul>{items}</ul>")


def rank_line(rank: dict, total: int) -> str:
    layers = rank.get("layers")
    held = (f"layers {layers[0]}\u2013{layers[1] - 1} ({layers[1] - layers[0]} of {total})"
            if layers else "no layers")
    return f"rank {rank['rank']}: {rank['role']}, {held}, on {rank['host']}"
