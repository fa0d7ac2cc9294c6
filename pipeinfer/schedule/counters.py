"""One generation's wall-clock marks and speculation counters (DESIGN.md section 6): kept by
the generation as the driver reports what happened; the metrics of a run's report are
derived from them (report/)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Timeline:
    """Wall-clock marks of one generation (time.perf_counter seconds)."""
    start: float = 0.0
    prefill_done: float = 0.0            # first logits back: the end of prefill
    accepted: list[float] = field(default_factory=list)  # one mark per generated token
    head_cpu_s: float | None = None      # the head process's CPU seconds (every thread)
    draft_cpu_s: float | None = None     # ... of them, the draft model's jobs (executors.py)
    loop_cpu_s: float | None = None      # ... of them, the driver's loop (its thread's, less
    #                                      the draft jobs run on it)

    def mark_token(self, count: int = 1) -> None:
        now = time.perf_counter()
        self.accepted.extend([now] * count)

    @property
    def prefill_s(self) -> float:
        return self.prefill_done - self.start

    @property
    def ttft_s(self) -> float | None:
        """End of prefill to the first accepted token not sampled from the prefill logits."""
        return self.accepted[1] - self.prefill_done if len(self.accepted) > 1 else None

    @property
    def gen_s(self) -> float:
        return (self.accepted[-1] - self.prefill_done) if self.accepted else 0.0

    @property
    def speed_tps(self) -> float | None:
        """Tokens generated after the first (which costs nothing after prefill) per second."""
        n = len(self.accepted) - 1
        return n / self.gen_s if n > 0 and self.gen_s > 0 else None

    @property
    def itl_s(self) -> float | None:
        n = len(self.accepted) - 1
        return (self.accepted[-1] - self.accepted[0]) / n if n > 0 else None


@dataclass
class Counters:
    """Speculation counters (zero for strategies that do not speculate)."""
    n_drafted: int = 0
    n_accepted: int = 0
    n_unverified: int = 0        # drafted tokens of runs dropped (cancelled) before verification
    n_drafted_ngram: int = 0     # of n_drafted, tokens drafted by n-gram lookup (the rest: model)
    n_accepted_ngram: int = 0    # of n_accepted, ... of those
    n_drafted_free: int = 0      # tokens a grammar forced, drafted without a draft-model step
    n_drafts_cut: int = 0        # drafted tokens a grammar forbade, cut before being sent
    runs_started: int = 0
    runs_speculative: int = 0
    runs_cancelled_superfluous: int = 0
    runs_cancelled_invalidated: int = 0
    runs_aborted_midway: int = 0
    microbatch_tokens: int = 0
    tree_steps: int = 0          # specpipe: target tokens verified against the tree
    tree_hits: int = 0           # specpipe: ... that were in it (the tree was rerooted)
    flushes: int = 0             # specpipe: pipeline flushes (misses)
    tree_nodes: int = 0          # specpipe: speculative tree nodes summed over steps

    @property
    def hit_rate(self) -> float | None:
        return self.tree_hits / self.tree_steps if self.tree_steps else None

    @property
    def mean_tree_size(self) -> float | None:
        return self.tree_nodes / self.tree_steps if self.tree_steps else None

    @property
    def accept_rate(self) -> float | None:
        """Share of the drafted tokens that were accepted (tokens of cancelled runs count as
        not accepted: they cost drafting and pipeline time)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def verified_accept_rate(self) -> float | None:
        """Share of the drafted tokens the target verified that it accepted: the draft's
        alignment as verification saw it (equals accept_rate when nothing was cancelled)."""
        verified = self.n_drafted - self.n_unverified
        return self.n_accepted / verified if verified > 0 else None

    @property
    def mean_microbatch(self) -> float | None:
        return self.microbatch_tokens / self.runs_speculative if self.runs_speculative else None
