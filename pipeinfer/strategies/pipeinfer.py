"""PipeInfer (paper IV): asynchronous, continuous speculation with KV multibuffering and early
inference cancellation.

The target pipeline always has a run evaluating the newest accepted token (a non-speculative
run, or a speculative run whose tree contains it). Whenever no result is waiting, the head
drafts another micro-batch continuing the newest speculation and starts it as a speculative
run. Confidence cutoff: a draft token is kept while its probability is at least
p_accept + p_adjust; p_adjust grows by p_recovery with every speculative run started, shrinks
by p_decay whenever drafting produced nothing while no result was waiting, and is reset to 0
whenever a result is verified (paper IV-B-2: "reset upon acceptance of a completed run").
"""

from __future__ import annotations

from ..backoff import IdleBackoff
from ..drafter import WARM_STEP, DraftParams
from ..generation import prefill
from ..run import trim_branches
from ..speculation import Speculation


def run(pipe, gen, sampler, cfg, drafter, pool) -> None:
    opts = cfg.spec
    spec = Speculation(pipe, gen, sampler, pool, cfg.kv_size, cancel=opts.cancel)
    warm = lambda: drafter.prepare(gen.request.prompt, max_tokens=WARM_STEP)
    gen.accept([prefill(pipe, gen, cfg.n_batch, idle=warm).token(-1, sampler)])
    spec.c0 = spec.pending
    if gen.done:
        return
    spec.start_main()
    draft_limit = opts.draft if opts.continuous else 2 * opts.draft
    params = DraftParams(draft_limit, opts.p_split, opts.n_parallel)
    p_adjust, failed_at, backoff = 0.0, None, IdleBackoff()
    n_stages = pipe.n_stages

    def ship_now() -> bool:
        """End the micro-batch being drafted: a result waits, or a target stage is idle (fewer
        runs in flight than stages), so the tokens drafted so far are worth more in the
        pipeline now than more tokens later."""
        return pipe.result_waiting() or (opts.continuous and pipe.in_flight < n_stages)

    while not gen.done:
        result = pipe.poll()
        if result is not None:
            spec.absorb(result)
            p_adjust, failed_at = 0.0, None
            if not gen.done and spec.cover() is None:
                if not spec.fits(1):
                    gen.stop_reason = "kv-cache"
                    break
                spec.start_main()
            backoff.reset()
            continue
        if _may_speculate(spec, pool, opts):
            context, source = spec.tip()
            cutoff = opts.p_accept + p_adjust
            attempt = (len(context), source, cutoff)
            # keep one cell for the non-speculative run a rejection may need
            budget = min(params.max_tokens, cfg.n_ctx - len(context), spec.kv_free - 1)
            if attempt != failed_at and budget > 0:
                branches, _ = drafter.draft(context, params, cutoff, max_tokens=budget,
                                            should_stop=ship_now)
                branches = trim_branches(branches, spec.kv_free - 1)
                if branches:
                    spec.start_speculative(context, branches, source, pool.take())
                    p_adjust += opts.p_recovery
                    failed_at = None
                    backoff.reset()
                    continue
                failed_at = attempt
                if opts.p_decay:
                    p_adjust -= opts.p_decay
                    failed_at = None  # the cutoff changed: worth another try
        backoff.wait()
    spec.settle()


def _may_speculate(spec: Speculation, pool, opts) -> bool:
    if pool.n_free == 0 or len(spec.fifo) >= opts.max_runs:
        return False
    if not opts.continuous and any(r.speculative for r in spec.live()):
        return False
    return True
