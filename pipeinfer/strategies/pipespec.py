"""PipeSpec (McDanel et al., Algorithm 1): a k-model hierarchy M0 < M1 < ... < target, every
model an asynchronous stage that verifies the one before it.

The draft models run on the head (hierarchy.py), interleaved cooperatively with the target
pipeline: between any two draft or verification steps the head polls the pipeline; or, with
`--layer-split .../1/1`, each on a rank of its own (hierarchy_remote.py), all concurrently. The target
is the existing pipeline, fed like PipeInfer's speculative runs: when the last draft model
M(k-1) has tokens beyond the newest speculation in flight, up to --draft of them go out as a
speculative run continuing it, with up to --max-runs runs in flight. They go out at once
(PipeSpec's "lookahead 0") while at most one run is in flight; with more queued, once a full
window (--draft tokens) is ready. Verification, KV multibuffering and cancellation are
speculation.py's; accepted tokens roll every draft buffer back to them.

When no run evaluates the newest accepted token (after a rejection), the next run is rooted at
it and carries whatever M(k-1) already proposes after it (a plain non-speculative run when
that is nothing), so the target never waits for the drafts.

Per-stage statistics (acceptance, tokens, step times) and PipeSpec's analytic expectation
(eq. 1-3) computed from them land in the result JSON as `pipespec_stages` and
`pipespec_expected`.
"""

from __future__ import annotations

from pathlib import Path

from ..backoff import IdleBackoff
from ..hierarchy import Hierarchy, StageStats, expectation
from ..hierarchy_remote import RemoteHierarchy
from .legacy import ImmediateSpeculation, accept, prefill


# Prompt tokens each draft model evaluates per warm-up step while the target prefills (the
# first token waits for at most about one step of every model).
WARM_TOKENS = 2


def build_hierarchy(drafter, cfg) -> Hierarchy:
    """The hierarchy over the draft models the runner loaded: a Drafter or a sequence of them
    (smallest first), or a ready Hierarchy."""
    if isinstance(drafter, (Hierarchy, RemoteHierarchy)):
        return drafter
    drafters = list(drafter) if isinstance(drafter, (list, tuple)) else [drafter]
    return Hierarchy([d.stage for d in drafters], cfg.n_batch, cfg.spec.draft)


def run(pipe, gen, sampler, cfg, drafter, pool, trace=None) -> None:
    """(`trace`: not written by this strategy yet; it is not on the scheduler core.)"""
    opts = cfg.spec
    hier = build_hierarchy(drafter, cfg)
    spec = ImmediateSpeculation(pipe, gen, sampler, pool, cfg.kv_size, cancel=opts.cancel)
    prompt = list(gen.request.prompt)
    hier.reset(prompt)
    accept(gen, [prefill(pipe, gen, cfg.n_batch,
                         idle=lambda: hier.warm(prompt, WARM_TOKENS)).token(-1, sampler)])
    spec.c0 = spec.pending
    hier.sync(spec.accepted)
    # drafting past the last token that can be generated is wasted
    limit = min(cfg.n_ctx, len(prompt) + gen.request.n_predict)
    ahead = opts.draft * opts.max_runs  # how far M0 may run ahead of the accepted tokens
    verified, rejections, backoff = 0, 0, IdleBackoff()
    if not gen.done and not _start_cover(spec, hier, pool, cfg):
        gen.stop_reason = "kv-cache"
    while not gen.done:
        result = pipe.poll()
        if result is not None:
            before = len(gen.tokens)
            runs = list(spec.fifo)  # the one absorbed and every later one
            spec.absorb(result)
            if len(gen.tokens) != before:
                verified += 1
                rejections += _rejected(spec, runs)
            hier.sync(spec.accepted)
            if not gen.done and spec.cover() is None and not _start_cover(spec, hier, pool,
                                                                          cfg):
                gen.stop_reason = "kv-cache"
                break
            backoff.reset()
            continue
        if _feed_target(spec, hier, pool, cfg):
            backoff.reset()
            continue
        if hier.step(min(len(spec.accepted) + ahead, limit)):
            _feed_target(spec, hier, pool, cfg)  # what the step produced goes out at once
            backoff.reset()
            continue
        backoff.wait()
    spec.settle()
    hier.finish(spec.accepted)  # no draft KV entries beyond the accepted tokens stay
    _report(gen, cfg, hier, verified, rejections)


def _start_cover(spec: ImmediateSpeculation, hier: Hierarchy, pool, cfg) -> bool:
    """A run rooted at the pending token, with M(k-1)'s proposal after it if there is one and
    a partition is free. False when the KV cache has no room left."""
    if not spec.fits(1):
        return False
    accepted = spec.accepted
    tokens = []
    if pool.n_free and len(spec.fifo) < cfg.spec.max_runs:
        budget = min(cfg.spec.draft, cfg.n_ctx - len(accepted), spec.kv_free - 2)
        tokens = hier.proposal(accepted, budget)
    if tokens:
        spec.start_speculative(accepted[:-1], [[accepted[-1]] + tokens], None)
    else:
        spec.start_main()
    return True


def _feed_target(spec: ImmediateSpeculation, hier: Hierarchy, pool, cfg) -> bool:
    """Start a speculative run with M(k-1)'s tokens continuing the newest speculation."""
    if pool.n_free == 0 or len(spec.fifo) >= cfg.spec.max_runs:
        return False
    context, source = spec.tip()
    # keep one cell for the non-speculative run a rejection may need
    budget = min(cfg.spec.draft, cfg.n_ctx - len(context), spec.kv_free - 1)
    tokens = hier.proposal(context, budget)
    # Lookahead 0 (the paper's setting) while the target would otherwise run dry; with runs
    # queued, a full window (fewer runs, and cheaper per token where batching pays off).
    need = 1 if len(spec.fifo) <= 1 else cfg.spec.draft
    if not tokens or len(tokens) < min(need, budget):
        return False
    spec.start_speculative(context, [tokens], source)
    return True


def _rejected(spec: ImmediateSpeculation, runs) -> bool:
    """After a verification: whether a token had been proposed for the new pending position
    (by the verified run or a run continuing it) and the target chose another."""
    if spec.gen.done or spec.cover() is not None:
        return False
    accepted, p = spec.accepted, spec.pending
    return any(_proposes(run, accepted, p) for run in runs)


def _proposes(run, accepted, p: int) -> bool:
    """Whether `run` holds a token for position p after accepted[:p]."""
    if run.base > p or list(accepted[:run.base]) != list(run.context):
        return False
    node = -1
    for q in range(run.base, p):
        node = next((c for c in run.children(node) if run.nodes[c].token == accepted[q]), None)
        if node is None:
            return False
    return bool(run.children(node))


def _report(gen, cfg, hier: Hierarchy, verified: int, rejections: int) -> None:
    c = gen.counters
    target = StageStats(Path(cfg.model).name, proposed=c.n_drafted, accepted=c.n_accepted,
                        rejections=rejections, produced=len(gen.tokens), steps=verified,
                        busy_s=gen.timeline.gen_s)
    row = target.row()
    # its verification window: the tokens per speculative run
    row["window"] = None if c.mean_microbatch is None else round(c.mean_microbatch, 4)
    rows = hier.rows() + [row]
    for i, row in enumerate(rows):
        row["role"] = "draft" if i == 0 else "target" if i == len(rows) - 1 else "verify"
    gen.extras["pipespec_stages"] = rows
    gen.extras["pipespec_expected"] = expectation(rows, cfg.spec.draft)
