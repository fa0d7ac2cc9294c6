"""One generation on the head: the strategy's scheduler, the draft executor, the driver."""

from __future__ import annotations

from ..drafting.drafter import DraftParams
from .pipeline import Pipeline
from ...schedule.generation import Generation
from ...schedule.iterative import Iterative
from ...schedule.options import ADAPTIVE, DRAFT_THREAD_STRATEGIES, EXACT_RUN_PLAIN, Limits
from ...schedule.adaptive import AdaptivePipeInfer
from ...schedule.pipeinfer import PipeInfer
from ...schedule.pipespec import PipeSpec
from ...schedule.specpipe import SpecPipe
from ...schedule.speculative import Speculative
from .driver import Driver
from ..drafting.executors import InlineDrafts, ThreadedDrafts
from ..drafting.ngram_drafts import NgramDrafts
from ..drafting.ngram_tree_drafts import NgramTreeDrafts
from ..drafting.hierarchy_drafts import HierarchyDrafts, build_hierarchy
from .trace import Trace
from ..drafting.tree_drafts import TreeDrafts

SCHEDULERS = {"iterative": Iterative, "speculative": Speculative, "pipeinfer": PipeInfer,
              "pipespec": PipeSpec, "specpipe": SpecPipe,
              ADAPTIVE: AdaptivePipeInfer}   # (serve's lanes: --busy-strategy auto)


def driver_for(strategy: str, pipe: Pipeline, gen: Generation, sampler, cfg, drafter=None,
               pool=None, trace: Trace | None = None, threaded_drafts: bool = False,
               track=None) -> Driver:
    """The driver of `gen` with `strategy` (a key of SCHEDULERS) and its draft executor;
    `cfg` gives n_batch, n_ctx, kv_size and the SpecOptions (`cfg.spec`). The draft model
    drafts on a thread of its own for pipeinfer (unless --no-draft-thread), and for every
    strategy with `threaded_drafts` (lanes: the head's loop keeps serving the other
    generations meanwhile). `track`: the request's grammar for the n-gram lookups
    (grammar_drafts.GrammarTrack), or None."""
    max_run = getattr(cfg, "max_run", EXACT_RUN_PLAIN)
    limits = Limits(cfg.n_batch, cfg.n_ctx, cfg.kv_size, pipe.n_stages, max_run)
    scheduler = SCHEDULERS[strategy](gen, sampler, limits, cfg.spec, pool)
    driver = Driver(pipe, scheduler, gen, trace=trace)
    if strategy == "pipespec":
        driver.drafts = HierarchyDrafts(build_hierarchy(drafter, cfg), gen, cfg)
    elif strategy == "specpipe":
        driver.drafts = tree_executor(cfg.spec, drafter)
    elif strategy != "iterative":
        driver.drafts = draft_executor(strategy, cfg.spec, drafter, driver.should_stop_draft,
                                       threaded_drafts, track)
    return driver


def draft_executor(strategy: str, opts, drafter, should_stop, threaded: bool = False,
                   track=None):
    """Where speculative's and pipeinfer's draft jobs run, by `opts.draft_source`: the draft
    model (inline, or for pipeinfer on a thread of its own), the n-gram lookup (under
    `track`'s grammar if given and there is no draft model), or both (the lookup first, the model for the jobs it cannot
    answer). None with no draft model."""
    model = None
    if drafter is not None and opts.draft_source != "ngram":
        # (a job's depth is its own budget, which the scheduler sets: not params.max_tokens)
        params = DraftParams(opts.draft, opts.p_split, opts.n_parallel)
        threaded = (threaded or strategy in DRAFT_THREAD_STRATEGIES) and opts.draft_thread
        model = (ThreadedDrafts(drafter, params) if threaded else
                 InlineDrafts(drafter, params, should_stop))
    if opts.draft_source == "model":
        return model
    # Under a grammar the lookups follow it only with no model behind them: with the draft
    # model's GrammarDrafter behind them, shaped lookups pre-empted it and were slower (JSON
    # request at 4 x 0.5 core, interleaved K=3: 6.0 against 6.4 t/s)
    return NgramDrafts(opts.ngram_min, opts.ngram_max, fallback=model,
                       track=track if model is None else None)


def tree_executor(opts, drafter):
    """Where specpipe's tree draft jobs run, by `opts.draft_source`: the draft model, the
    n-gram lookup, or both (the lookup's rows where it matches, the model's otherwise)."""
    if opts.draft_source == "model":
        return TreeDrafts(drafter)
    model = TreeDrafts(drafter) if drafter is not None and opts.draft_source != "ngram" \
        else None
    return NgramTreeDrafts(opts.ngram_min, opts.ngram_max, fallback=model)


def generate(*args, **kw) -> None:
    """Run a generation to its end (the arguments of driver_for)."""
    driver_for(*args, **kw).run()


def strategy_runner(strategy: str):
    """`generate` for one strategy, with the signature of the strategies table."""
    def run(pipe, gen, sampler, cfg, drafter=None, pool=None, trace=None):
        generate(strategy, pipe, gen, sampler, cfg, drafter, pool, trace)
    run.__name__ = f"run_{strategy}"
    return run
