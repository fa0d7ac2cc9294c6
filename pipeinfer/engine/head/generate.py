"""One generation on the head: the strategy's scheduler, the draft executor, the driver."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import strategies
from ...schedule.generation import Generation
from ...schedule.options import Limits
from ..drafting.drafter import DraftParams
from ..drafting.executors import InlineDrafts, ThreadedDrafts
from ..drafting.hierarchy_drafts import HierarchyDrafts, build_hierarchy
from ..drafting.ngram_drafts import NgramDrafts
from ..drafting.ngram_tree_drafts import NgramTreeDrafts
from ..drafting.tree_drafts import TreeDrafts
from .driver import Driver
from .pipeline import Pipeline
from .trace import Trace


@dataclass(frozen=True)
class Drafting:
    """What a generation drafts with: the draft model(s) (a Drafter, a list of them for
    pipespec, or None), the request's grammar for the n-gram lookups
    (grammar_drafts.GrammarTrack, or None), and whether the draft model runs on a thread of
    its own whatever the strategy (lanes: the head's loop keeps serving the other
    generations meanwhile)."""
    drafter: Any = None
    track: Any = None
    threaded: bool = False


def driver_for(strategy: str, pipe: Pipeline, gen: Generation, sampler, cfg,
               drafting: Drafting = Drafting(), pool=None, trace: Trace | None = None) -> Driver:
    """The driver of `gen` with `strategy` (a name of pipeinfer/strategies/) and its draft
    executor; `cfg` gives n_batch, n_ctx, kv_size and the SpecOptions (`cfg.spec`). The
    draft model drafts on a thread of its own for pipeinfer (unless --no-draft-thread) and
    for every strategy with `drafting.threaded`."""
    limits = Limits(cfg.n_batch, cfg.n_ctx, cfg.kv_size, pipe.n_stages, cfg.max_run,
                    cfg.chunk, cfg.prefill_tail)
    plan = strategies.get(strategy)
    scheduler = plan.scheduler_class()(gen, sampler, limits, cfg.spec, pool)
    driver = Driver(pipe, scheduler, gen, trace=trace)
    if plan.drafts == strategies.HIERARCHY:
        driver.drafts = HierarchyDrafts(build_hierarchy(drafting.drafter, cfg), gen, cfg)
    elif plan.drafts == strategies.TREE:
        driver.drafts = tree_executor(cfg.spec, drafting.drafter)
    elif plan.drafts == strategies.TOKENS:
        driver.drafts = draft_executor(plan, cfg.spec, drafting, driver.should_stop_draft,
                                       pipe.row_costs)
    return driver


def draft_executor(plan: strategies.Strategy, opts, drafting: Drafting, should_stop,
                   row_costs: tuple[float, ...] = ()):
    """Where speculative's and pipeinfer's draft jobs run, by `opts.draft_source`: the draft
    model (inline, or for pipeinfer on a thread of its own), the n-gram lookup (under
    the request's grammar if given and there is no draft model), or both (the lookup first,
    the model for the jobs it cannot answer). None with no draft model. `row_costs`: the
    pipeline's (Pipeline.row_costs, empty unless its workers were timed), for the drafter."""
    model, drafter = None, drafting.drafter
    if drafter is not None and opts.draft_source != "ngram":
        # (a job's depth is its own budget, which the scheduler sets: not params.max_tokens)
        params = DraftParams(opts.draft, opts.p_split, opts.n_parallel, row_costs)
        threaded = (drafting.threaded or plan.draft_thread) and opts.draft_thread
        model = (ThreadedDrafts(drafter, params) if threaded else
                 InlineDrafts(drafter, params, should_stop))
    if opts.draft_source == "model":
        return model
    # Under a grammar the lookups follow it only with no model behind them: with the draft
    # model's GrammarDrafter behind them, shaped lookups pre-empted it and were slower
    return NgramDrafts(opts.ngram_min, opts.ngram_max, fallback=model,
                       track=drafting.track if model is None else None)


def tree_executor(opts, drafter):
    """Where specpipe's tree draft jobs run, by `opts.draft_source`: the draft model, the
    n-gram lookup, or both (the lookup's rows where it matches, the model's otherwise)."""
    if opts.draft_source == "model":
        return TreeDrafts(drafter)
    model = TreeDrafts(drafter) if drafter is not None and opts.draft_source != "ngram" \
        else None
    return NgramTreeDrafts(opts.ngram_min, opts.ngram_max, fallback=model)
