"""Timing llama.cpp on this rank for calibration: one target layer per step size (and per
prompt chunk), the output layer per step size, the draft model per token, and free memory.
No MPI here (calibrate.py gathers)."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model.balance import layer_bytes
from ..model.draft_vocab import KEPT_KEY
from ..model.gguf_header import read_header
from ..model.partition import StageRange
from ..model.stage import Stage, StageConfig
from ..model.stage_cache import stage_file
from . import cgroups
from .cost import PREFILL_STEP, STEP_SIZES

CALIBRATION_MB = 256
CONTEXT = 64        # positions already in the cache when a step is timed (as mid-generation)
REPEATS = 5         # timed steps per size at least (the median is kept), more while they
MIN_TOTAL_S = 0.15  # took less than this in all (fast steps are noisy), up to MAX_REPEATS
MAX_REPEATS = 40
PROBE_REPEATS = 3
PREFILL_REPEATS = 2  # a prompt chunk's step: long (0.8 s for the 10-layer slice of Qwen2.5-Coder
                     # 1.5B on a core here), so steady; two keep calibration short


def calibration_ranges(model: Path, n_layer: int) -> tuple[StageRange, StageRange]:
    """The slices timed: the first k layers (not final) for a layer's time, the last k with
    the output layer for the output's time (the difference). k layers weigh at least
    CALIBRATION_MB where the model allows (half its layers at most): a smaller slice fits the
    CPU's cache better than a stage's does, and runs faster per layer."""
    per_layer, _ = layer_bytes(read_header(model), n_layer)
    mean_mb = sum(per_layer) / n_layer / 2 ** 20
    k = max(1, min(n_layer // 2, math.ceil(CALIBRATION_MB / max(mean_mb, 1e-3))))
    return StageRange(1, 0, k, False), StageRange(1, n_layer - k, n_layer, True)


def _config(threads: int, repack: bool, largest: int = max(STEP_SIZES)) -> StageConfig:
    """A context for steps of up to `largest` tokens after CONTEXT positions (the final
    slice's stays small: its logits buffer is a batch's rows x the vocabulary)."""
    return StageConfig(n_ctx=CONTEXT + 2 * largest + 8, n_batch=max(CONTEXT, largest),
                       n_seq_max=1, n_threads=threads, repack=repack)


def _step_ms(stage: Stage, b: int, repeats: int, tokens: bool = False) -> float:
    """Median milliseconds of a b-token step at position CONTEXT (argmax of every row on a
    final stage, as the last rank computes it under greedy sampling)."""
    rng = np.random.default_rng(b)
    positions, seqs = list(range(CONTEXT, CONTEXT + b)), [(0,)] * b
    embd = None if tokens else (rng.standard_normal((b, stage.n_embd)) * 0.1).astype(np.float32)
    ids = [100 + i for i in range(b)] if tokens else None
    times: list[float] = []
    while len(times) < repeats or (sum(times) < MIN_TOTAL_S and len(times) < MAX_REPEATS):
        t0 = time.perf_counter()
        out = stage.decode(positions, seqs, embd=embd, tokens=ids)
        if stage.final:
            np.argmax(out, axis=1)
        times.append(time.perf_counter() - t0)
        stage.seq_rm(0, CONTEXT, -1)
    return 1e3 * statistics.median(times)


def _fill_context(stage: Stage, tokens: bool = False) -> None:
    positions, seqs = list(range(CONTEXT)), [(0,)] * CONTEXT
    if tokens:
        stage.decode(positions, seqs, tokens=[100 + i % 50 for i in range(CONTEXT)])
    else:
        stage.decode(positions, seqs, embd=np.full((CONTEXT, stage.n_embd), 0.01, np.float32))


@dataclass(frozen=True)
class Slices:
    """The calibration slices of calibration_ranges as this rank's files."""
    body: Path
    body_layers: int
    last: Path


def local_slices(model: Path, n_layer: int) -> Slices:
    """The calibration slices cut from this machine's own copy of `model`."""
    body, last = calibration_ranges(model, n_layer)
    return Slices(stage_file(model, body), body.n_layer, stage_file(model, last))


def measure_layers(slices: Slices, threads: int, repack: bool = True,
                   sizes=STEP_SIZES, repeats: int = REPEATS,
                   prefill: int = PREFILL_STEP) -> tuple[dict, dict]:
    """({b: ms of one layer}, {b: ms of the output layer}) for b-token steps, b in `sizes`;
    the layer also for a `prefill`-token prompt chunk (0: not), whose output layer computes
    one row at most, as a 1-token step's does."""
    with Stage(slices.body, _config(threads, repack, max(*sizes, prefill)), final=False,
               label="calibration layers") as stage:
        _fill_context(stage)
        layers = {b: _step_ms(stage, b, repeats) for b in sizes}
        if prefill:
            layers[prefill] = _step_ms(stage, prefill, PREFILL_REPEATS)
    with Stage(slices.last, _config(threads, repack), final=True,
               label="calibration output") as stage:
        _fill_context(stage)
        output = {b: max(0.0, _step_ms(stage, b, repeats) - layers[b]) for b in sizes}
    return {b: ms / slices.body_layers for b, ms in layers.items()}, output


def probe_layer_ms(slices: Slices, threads: int, repack: bool = True) -> float:
    """A quick measure of one layer's 1-token step (to see whether a profile still holds)."""
    with Stage(slices.body, _config(threads, repack), final=False,
               label="calibration probe") as stage:
        _fill_context(stage)
        return _step_ms(stage, 1, PROBE_REPEATS) / slices.body_layers


def measure_draft(draft: Path, threads: int) -> float:
    """Milliseconds per drafted token: a 1-token step of the whole draft model, and the
    drafter's choice of the token from its logits (a softmax over the vocabulary and the
    two best, engine/drafting/drafter.py: ~1 ms a token for Qwen2.5's 151,936 on a core here). A
    reduced-vocabulary draft (model/draft_vocab.py) is fed embeddings, as the head feeds it,
    and its logits rows are K wide."""
    tokens = KEPT_KEY not in read_header(draft).fields
    with Stage(draft, _config(threads, True), final=True, label="calibration draft") as stage:
        _fill_context(stage, tokens=tokens)
        step = _step_ms(stage, 1, REPEATS, tokens=tokens)
        one = {"tokens": [100]} if tokens else \
            {"embd": np.full((1, stage.n_embd), 0.01, np.float32)}
        logits = stage.decode([CONTEXT], [(0,)], **one)[-1]
        stage.seq_rm(0, CONTEXT, -1)
    return step + _pick_ms(logits)


def _pick_ms(logits: np.ndarray) -> float:
    from ..engine.drafting.drafter import candidates
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        candidates(logits)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def free_mb() -> float:
    """Memory this rank may still use, in MB: the system's available memory, or what the
    rank's cgroup allows beyond its current use, whichever is less."""
    available = float("inf")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) / 1024
    except OSError:
        pass
    left = cgroups.memory_left_mb()
    if left is not None:
        available = min(available, left)
    return round(available, 1) if available != float("inf") else 0.0
