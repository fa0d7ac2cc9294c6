"""PipeInfer (paper IV): asynchronous, continuous speculation with KV multibuffering and early
inference cancellation.

The target pipeline always has a run evaluating the newest accepted token (a non-speculative
run, or a speculative run whose tree contains it). Whenever no result is waiting, the head
drafts another micro-batch continuing the newest speculation and starts it as a speculative
run. Confidence cutoff: a draft token is kept while its probability is at least
p_accept + p_adjust; p_adjust grows by p_recovery with every speculative run started, shrinks
by p_decay whenever drafting produced nothing while no result was waiting, and is reset to 0
whenever a result is verified (paper IV-B-2: "reset upon acceptance of a completed run").

By default (the CLI's; SpecOptions.draft_thread) the draft model runs on a thread of its own
(draft_thread.py), so results are absorbed and runs started while a micro-batch is drafted;
a micro-batch whose speculation moved on meanwhile is rebased onto the newest one (its tokens
after what was accepted) or dropped. With --no-draft-thread the head drafts on its main
thread and checks for results between draft steps.
"""

from __future__ import annotations

from ..backoff import IdleBackoff
from ..draft_thread import DraftJob, DraftThread
from ..drafter import WARM_STEP, DraftParams
from ..generation import prefill
from ..run import trim_branches
from ..speculation import Speculation


def run(pipe, gen, sampler, cfg, drafter, pool) -> None:
    if cfg.spec.draft_thread:
        return _run_threaded(pipe, gen, sampler, cfg, drafter, pool)
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


def _run_threaded(pipe, gen, sampler, cfg, drafter, pool) -> None:
    """The same schedule with the draft model on a thread of its own (draft_thread.py): the
    head absorbs results and starts runs while a micro-batch is being drafted."""
    opts = cfg.spec
    spec = Speculation(pipe, gen, sampler, pool, cfg.kv_size, cancel=opts.cancel)
    draft_limit = opts.draft if opts.continuous else 2 * opts.draft
    drafts = DraftThread(drafter, DraftParams(draft_limit, opts.p_split, opts.n_parallel))
    try:
        drafts.warm(gen.request.prompt)
        gen.accept([prefill(pipe, gen, cfg.n_batch).token(-1, sampler)])
        spec.c0 = spec.pending
        if gen.done:
            return
        spec.start_main()
        _schedule(pipe, gen, cfg, spec, pool, drafts)
    finally:
        drafts.close()
    spec.settle()


def _schedule(pipe, gen, cfg, spec: Speculation, pool, drafts: DraftThread) -> None:
    opts = cfg.spec
    p_adjust, failed_at, backoff = 0.0, None, IdleBackoff()
    n_stages = pipe.n_stages
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
            job = drafts.current
            if job is not None and not gen.done and not _extends(spec.tip()[0], job.context):
                job.stop.set()  # it continues a speculation that is gone: stop early
            backoff.reset()
            continue
        job = drafts.poll()
        if job is not None:
            backoff.reset()
            if job.interrupted:
                continue  # stopped before it drafted anything: draft again
            context, source = spec.tip()
            branches = trim_branches(_rebase(job, context), spec.kv_free - 1)
            if branches and _may_speculate(spec, pool, opts):
                spec.start_speculative(context, branches, source, pool.take())
                p_adjust += opts.p_recovery
                failed_at = None
            elif not job.branches:
                failed_at = (len(job.context), job.source, job.cutoff)
                if opts.p_decay:
                    p_adjust -= opts.p_decay
                    failed_at = None  # the cutoff changed: worth another try
            continue
        if not drafts.busy and _may_speculate(spec, pool, opts):
            context, source = spec.tip()
            cutoff = opts.p_accept + p_adjust
            budget = min(drafts.params.max_tokens, cfg.n_ctx - len(context), spec.kv_free - 1)
            if (len(context), source, cutoff) != failed_at and budget > 0:
                drafts.submit(DraftJob(context, source, cutoff, budget))
                continue
        job = drafts.current
        if job is not None and opts.continuous and pipe.in_flight < n_stages:
            job.stop.set()  # a target stage idles: ship the tokens drafted so far
        backoff.wait()


def _extends(tokens, prefix) -> bool:
    return len(tokens) >= len(prefix) and list(tokens[:len(prefix)]) == list(prefix)


def _rebase(job: DraftJob, context: list[int]) -> list[list[int]]:
    """The job's branches continuing `context`, the newest speculation now: the tokens after
    it of every branch that agrees with what the tip gained meanwhile (the accepted tokens
    the draft had guessed, typically); none if the tip left the job's context."""
    if not _extends(context, job.context):
        return []
    gained = list(context[len(job.context):])
    n = len(gained)
    return [b[n:] for b in job.branches or [] if len(b) > n and b[:n] == gained]


def _may_speculate(spec: Speculation, pool, opts) -> bool:
    if pool.n_free == 0 or len(spec.fifo) >= opts.max_runs:
        return False
    if not opts.continuous and any(r.speculative for r in spec.live()):
        return False
    return True
