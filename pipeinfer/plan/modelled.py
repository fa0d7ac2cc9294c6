"""Nodes that are not measured one by one: this machine's figures scaled by each node's share of
a core (what a cgroup CPU quota gives), and links from presets. For `simulate` and `plan`
without a profile, and for models one does not have (a header-only GGUF): their layers cost
what a measured model's cost per byte of weights says.

This machine's figures (one thread, a whole core) are measured once per model and host and
cached (cache_dir()/profiles/local-*.json); a draft model's time per token likewise.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

from ..model.balance import layer_bytes
from ..model.gguf_header import read_header
from ..model.models import cache_dir
from ..model.slicing import model_info
from ..model.stage_cache import content_digest
from . import measure
from .cost import PREFILL_STEP, STEP_SIZES, CostError, NodeCost

log = logging.getLogger(__name__)

# (round trip ms, MB/s) of the link presets of experiments/cluster.py: gigabit = 1 Gbit/s and
# 0.2 ms each way, slow = 100 Mbit/s and 1 ms each way; none = loopback (shared memory).
LINKS = {"none": (0.0, 0.0), "gigabit": (0.4, 125.0), "slow": (2.0, 12.5)}
# A transaction's handling per stage in Python (receive, forward, polling) on a whole core;
# a quota of F cores stretches it 1/F (DESIGN.md 11: ~2.5 ms per hop at a quarter core).
HOP_OVERHEAD_MS = 0.6


def parse_link(text: str) -> tuple[float, float]:
    """A preset name, or "LAT,BW": one-way latency in ms and bandwidth in Mbit/s."""
    if text in LINKS:
        return LINKS[text]
    try:
        latency, mbit = (float(v) for v in text.split(","))
    except ValueError:
        raise CostError(f"--link {text!r}: give {', '.join(LINKS)} or LAT,BW (one-way ms, "
                        "Mbit/s), e.g. 0.2,1000") from None
    if latency < 0 or mbit <= 0:
        raise CostError(f"--link {text!r}: latency must be >= 0 and bandwidth > 0")
    return 2 * latency, mbit / 8


def has_weights(path: Path) -> bool:
    header = read_header(path)
    return all(t.offset + t.n_bytes <= header.file_size for t in header.tensors.values())


def _cached(kind: str, path: Path, measure_it):
    key = f"local-{kind}-{socket.gethostname()}-{content_digest(path)[:24]}.json"
    where = cache_dir() / "profiles" / key
    try:
        return json.loads(where.read_text())
    except (OSError, ValueError):
        pass
    log.info("measuring %s on this machine (one thread, once per model)", path.name)
    figures = measure_it()
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_name(where.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(figures))
    os.replace(tmp, where)
    return figures


def local_layers(path: Path) -> tuple[dict[int, float], dict[int, float]]:
    """(layer_ms, output_ms) of the model at `path` on one whole core of this machine. The
    cache entry is named by the step sizes measured, so figures that lack one (the prompt
    chunk's) are measured again rather than extrapolated."""
    def run():
        header = read_header(path)
        slices = measure.local_slices(path, model_info(header, path).n_layer)
        layer, output = measure.measure_layers(slices, 1, prefill=PREFILL_STEP)
        return {"layer_ms": layer, "output_ms": output}
    sizes = "-".join(map(str, STEP_SIZES)) + f"-prefill{PREFILL_STEP}"
    figures = _cached("layers-" + sizes, path, run)
    return ({int(b): v for b, v in figures["layer_ms"].items()},
            {int(b): v for b, v in figures["output_ms"].items()})


def local_draft_ms(path: Path) -> float:
    return float(_cached("draft-picked", path,
                         lambda: {"ms": measure.measure_draft(path, 1)})["ms"])


def scaled_layers(target: Path, reference: Path) -> tuple[dict, dict]:
    """A header-only model's figures: the reference's, times the ratio of bytes per layer
    (and of the output layers' bytes)."""
    layer, output = local_layers(reference)
    t_layer, t_out = _bytes(target)
    r_layer, r_out = _bytes(reference)
    return ({b: ms * t_layer / r_layer for b, ms in layer.items()},
            {b: ms * t_out / r_out for b, ms in output.items()})


def _bytes(path: Path) -> tuple[float, float]:
    header = read_header(path)
    per_layer, final = layer_bytes(header, model_info(header, path).n_layer)
    return sum(per_layer) / len(per_layer), final


def nodes(cpus: list[float], layer_ms: dict, output_ms: dict, draft_ms: float,
          link: tuple[float, float]) -> tuple[NodeCost, ...]:
    """One NodeCost per CPU share: whole-core figures stretched by 1/share (one thread cannot
    use more than a core), links from the preset plus the Python handling per hop."""
    out = []
    for rank, cpu in enumerate(cpus):
        if not 0 < cpu <= 64:
            raise CostError(f"node {rank}: --cpu {cpu} must be more than 0")
        stretch = 1 / min(cpu, 1.0)
        rtt = link[0] + 2 * HOP_OVERHEAD_MS * stretch
        out.append(NodeCost(f"node{rank}", {b: ms * stretch for b, ms in layer_ms.items()},
                            {b: ms * stretch for b, ms in output_ms.items()}, None, rtt,
                            link[1] or float("inf"),
                            draft_ms * stretch if rank == 0 else 0.0, cpu))
    return tuple(out)
