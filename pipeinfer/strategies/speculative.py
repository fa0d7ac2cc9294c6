"""Synchronous speculative pipeline parallelism (SpecInfer-style baseline): draft a token tree,
verify it in one pass through the target pipeline, accept the longest verified path plus the
target's next token, repeat. Drafting and verification wait for each other."""

from __future__ import annotations

from ..drafter import WARM_STEP, DraftParams
from ..generation import prefill
from ..run import trim_branches
from ..speculation import Speculation


def run(pipe, gen, sampler, cfg, drafter, pool) -> None:
    spec = Speculation(pipe, gen, sampler, pool, cfg.kv_size)
    warm = lambda: drafter.prepare(gen.request.prompt, max_tokens=WARM_STEP)
    gen.accept([prefill(pipe, gen, cfg.n_batch, idle=warm).token(-1, sampler)])
    spec.c0 = spec.pending
    params = DraftParams(cfg.spec.draft, cfg.spec.p_split, cfg.spec.n_parallel)
    while not gen.done:
        context = spec.accepted
        budget = min(params.max_tokens, cfg.n_ctx - len(context), spec.kv_free - 1)
        if budget < 0:
            gen.stop_reason = "kv-cache"
            break
        branches, _ = drafter.draft(context, params, cfg.spec.p_accept, max_tokens=budget)
        branches = trim_branches(branches, spec.kv_free - 1)  # the tree's root takes a cell
        pending = context[-1]
        tree = [[pending] + branch for branch in branches] or [[pending]]
        spec.start_speculative(context[:-1], tree, None, pool.take())
        spec.absorb(pipe.wait())
