"""The cost model of a pipeline: what one stage costs per step, and what bounds a strategy.

A node (one MPI rank) is described by measured figures (calibrate.py): the time of one target
layer for a step of b tokens (b = 1, 2, 3, 4, 8 and a prompt chunk's PREFILL_STEP; other sizes
interpolated), the time of the output layer (norm, output matrix, argmax) for b output rows
(b = 1 .. 8), its free memory, the link to the next node
(round trip, bandwidth) and, on the head, the draft model's time per drafted token. The model is
described by its shape: layers, bytes per layer and of the output layer, the hidden state's
bytes per token.

A stage with k layers costs k x layer(b) (+ output(r) if it is the last stage, for the r rows of
the step that give logits: all of a run's, one of a prompt's last chunk, none of its others)
per step. The
strategies differ in what bounds them (DESIGN.md section 11):
- iterative (and synchronous speculative): one run in flight, so a token costs the sum of the
  stage times and the hops between them ("sum");
- pipelined speculation (pipeinfer, pipespec, specpipe): runs overlap, so the slowest stage
  paces the pipeline, and the head must draft the tokens as fast ("max").
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .. import strategies
from ..config.job import PREFILL_CHUNK

# 3 is measured, not interpolated: it is the size of every speculative run under --exact with
# repacked weights, and llama.cpp's repacked kernels (which take 4 rows at a time) run it
# slower per token than 2 or 4
STEP_SIZES = (1, 2, 3, 4, 8)
# A prompt goes in as chunks of this many tokens (config/job.py): a batch that size may cost far
# less per token than the small steps' slope says (llama.cpp's matrix-matrix kernels: a third
# of it for Qwen2.5-Coder 1.5B Q4_K_M repacked on a core here, 0.86 for SmolLM2's Q4_1), so its
# layer time is measured too. Its output layer is not: a chunk gives one row of logits at most.
PREFILL_STEP = PREFILL_CHUNK

# While the head's draft thread drafts, the head's own loop (polling the pipeline's results and
# the drafter, the scheduler's ticks) takes a share of the head's CPU: cores used by the loop,
# by the cores the head may use (a cgroup quota), from the per-thread CPU time of the head's
# threads in pipeinfer runs of the Qwen pair at 2, 4 and 8 nodes (the simulator's validation
# in the documentation's results). Between: interpolated.
HEAD_LOOP_CORES = {0.25: 0.035, 0.5: 0.05, 1.0: 0.075}


class CostError(ValueError):
    """Figures the cost model cannot work with; the message says which and why."""


def interpolate(table: dict[int, float], b: float) -> float:
    """The figure of a b-token step from a table of measured step sizes: linear between the
    two nearest, extended linearly past the ends (never below 0)."""
    if not table:
        raise CostError("no measured step sizes")
    sizes = sorted(table)
    if len(sizes) == 1:
        return table[sizes[0]] * b / sizes[0]
    i = min(max(bisect.bisect_left(sizes, b), 1), len(sizes) - 1)
    lo, hi = sizes[i - 1], sizes[i]
    slope = (table[hi] - table[lo]) / (hi - lo)
    return max(0.0, table[lo] + slope * (b - lo))


def costs_step(table: dict[int, float], b: float) -> bool:
    """Whether `table` costs a b-token step from measurements: b is within its sizes, or past
    a prompt chunk's (where a step's time grows about in proportion to its tokens). Not so
    for a table of small steps only (a profile without the prompt chunk's step): its slope,
    extended, may cost a 128-token batch three times too much (see PREFILL_STEP)."""
    largest = max(table, default=0)
    return b <= largest or largest >= PREFILL_STEP


@dataclass(frozen=True)
class NodeCost:
    """One node's figures, milliseconds and megabytes. `link_*`: to the next node (the last
    node's: back to the head). `memory_mb` None: not limited."""
    name: str
    layer_ms: dict[int, float]
    output_ms: dict[int, float]
    memory_mb: float | None = None
    link_rtt_ms: float = 0.0
    link_mb_s: float = float("inf")
    draft_ms: float = 0.0            # head: the draft model's time per drafted token
    cores: float | None = None       # the CPU the node's rank may use (None: not known)

    def draft_step_ms(self, threaded: bool) -> float:
        """Time per drafted token during a generation: draft_ms was measured with the draft
        alone. Drafting on its own thread (`threaded`, pipeinfer) on a node with little
        more than a core or less, it gets only what the head's loop leaves of it."""
        if not threaded or not self.draft_ms or self.cores is None:
            return self.draft_ms
        alone = min(1.0, self.cores)
        shared = min(1.0, self.cores - interpolate(HEAD_LOOP_CORES, alone))
        return self.draft_ms * alone / max(shared, 0.1 * alone)

    def layers_ms(self, k: int, b: float) -> float:
        return k * interpolate(self.layer_ms, b)

    def output(self, rows: float) -> float:
        """The output layer for `rows` rows of logits (none: nothing computed)."""
        return interpolate(self.output_ms, rows) if rows > 0 else 0.0

    def send_ms(self, n_bytes: float) -> float:
        """Time the link is occupied by a message (bandwidth only)."""
        return n_bytes / (self.link_mb_s * 1e3) if self.link_mb_s > 0 else 0.0

    def hop_ms(self, n_bytes: float) -> float:
        """Latency of a message to the next node: half a round trip plus the transfer."""
        return self.link_rtt_ms / 2 + self.send_ms(n_bytes)


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of the target model (model_shape() reads it from GGUF)."""
    name: str
    n_layer: int
    layer_mb: float           # one layer's weights (+ its KV cache)
    output_mb: float          # what only the last stage holds: output norm and matrix
    hidden_bytes: int         # one token's activations between stages (n_embd x 4)
    base_mb: float = 250.0    # what every rank holds besides layers (runtime, buffers)
    head_mb: float = 0.0      # the head's extras: the draft model, token embeddings


@dataclass(frozen=True)
class Pipeline:
    """A cluster and a model: the costs the solver and the simulator work from."""
    nodes: tuple[NodeCost, ...]
    model: ModelShape
    draft_tokens: int = 0     # draft tokens the head drafts per run (0: no draft model)
    draft_thread: bool = False  # the head drafts on a thread of its own, beside its loop
    notes: tuple[str, ...] = field(default=())

    def stage_ms(self, rank: int, k: int, final: bool, b: float,
                 rows: float | None = None) -> float:
        """Compute time of rank `rank` with k layers for a b-token step of which `rows` give
        logits (None: all of them, as in a run after the prompt); the head's drafting of the
        run's tokens counted on the head."""
        node = self.nodes[rank]
        t = node.layers_ms(k, b) + (node.output(b if rows is None else rows) if final else 0.0)
        if rank == 0:
            t += self.drafting_ms()
        return t

    def drafting_ms(self) -> float:
        """The head's drafting of one run's draft tokens."""
        return self.draft_tokens * self.nodes[0].draft_step_ms(self.draft_thread)

    def memory_cap(self, rank: int, final: bool) -> int:
        """Most layers rank `rank` can hold (-1: not even the output layer fits)."""
        node, m = self.nodes[rank], self.model
        if node.memory_mb is None:
            return m.n_layer
        free = node.memory_mb - m.base_mb - (m.head_mb if rank == 0 else 0.0)
        free -= m.output_mb if final else 0.0
        if free < 0:
            return -1
        return min(m.n_layer, int(free // m.layer_mb)) if m.layer_mb > 0 else m.n_layer

    def item(self, rank: int, k: int, final: bool, b: float, shape: str) -> float:
        """Rank `rank`'s share of the strategy's bound: "sum" counts its compute and the hop
        to the next stage (latency), "max" its compute and the time its link is busy."""
        node = self.nodes[rank]
        size = 4 * b if final else self.model.hidden_bytes * b  # argmaxes back to the head
        link = node.hop_ms(size) if shape == "sum" else node.send_ms(size)
        return self.stage_ms(rank, k, final, b) + link


def draft_tokens(strategy: str, with_draft_model: bool) -> int:
    """Tokens the head's draft model drafts per run of `strategy` (Strategy.draft_tokens)."""
    return _strategy(strategy).draft_tokens(with_draft_model)


def drafts_on_thread(strategy: str | None) -> bool:
    """Whether the strategy drafts on a thread beside the head's loop (engine/head/generate.py)."""
    return strategy is not None and _strategy(strategy).draft_thread


def strategy_shape(strategy: str) -> tuple[str, int]:
    """What bounds `strategy` ("sum" of stage times or their "max") and the tokens of a
    typical run after the prompt (pipeinfer's and speculative's are cut to 3 under --exact
    with repacked weights; specpipe's tree levels and pipespec's verifications are
    --draft/--tree-width wide, 4 by default)."""
    plan = _strategy(strategy)
    return plan.bound, plan.run_tokens


def _strategy(name: str) -> strategies.Strategy:
    try:
        return strategies.get(name)
    except ValueError as err:
        raise CostError(str(err)) from None
