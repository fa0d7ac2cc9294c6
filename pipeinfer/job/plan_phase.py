"""A job's start before anything loads (Job.start's first step, collective): rank 0 checks
the options, settles the draft files and plans the split (`auto`: every rank takes part),
names every rank's file; every rank learns the outcome, or StartFailed with the failing
rank's message (describe: the one-line report of an error)."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Sequence, TypeVar

from ..config.job import JobConfig
from ..engine.files.draft_files import DraftFile, settle_drafts
from ..engine.files.weights import Manifest, WeightsError, draft_need, target_needs
from ..engine.transport.mpi import LOST_PEER, MPI_ERRORS, Link, RankFailed, hostname
from ..engine.transport.transfer import TransferError
from ..model.llama_lib import LlamaError
from ..model.stage_cache import content_digest
from ..model.tokenizer import Tokenizer
from .setup import SETUP_ERRORS, draft_rank_file, plan, prompt_tokens

log = logging.getLogger(__name__)
T = TypeVar("T")


class StartFailed(Exception):
    """A rank could not load its part of the job; the message names it."""


RUN_ERRORS = (RankFailed, LlamaError)          # expected while a job runs


def describe(err: Exception, verbose: int = 0, known: tuple = RUN_ERRORS) -> str:
    """The one-line report of an error: its message if it is of a `known` kind, else (a bug)
    its type too, and a hint unless `verbose`; its traceback is logged (DEBUG, shown by -v)."""
    log.debug("traceback of %s: %s", type(err).__name__, err, exc_info=err)
    if isinstance(err, known):
        return str(err)
    if isinstance(err, MPI_ERRORS):   # a peer is gone: the launcher names it
        return f"{LOST_PEER}; MPI said: {str(err).splitlines()[0]}"
    return f"internal error: {type(err).__name__}: {err}" + ("" if verbose else
                                                             " (run with -v for the traceback)")


def plan_phase(link: Link, cfg: JobConfig, check: Callable[[], None] | None):
    """Collective: rank 0 checks, settles the draft files and --draft-vocab (draft_files.py),
    plans the split (auto: every rank takes part) and names every rank's file; every rank gets
    the settled config and (model, ranges, manifest), rank 0 the target's tokenizer and the
    draft files too (None and () elsewhere) and with --layer-split auto what the planner
    predicts (plan/auto.predicted), or StartFailed. Its first link.agree is the one
    abandon_start (cli/runner.py) answers."""
    rank, size = link.rank, link.size
    shared, tokenizer, drafts, error, predicted = None, None, (), None, None
    if rank == 0:
        settled, error = _attempt(cfg, lambda: _first_checks(cfg, check, size))
        if settled is not None:
            cfg, drafts = settled
    if cfg.split == "auto":  # collective: calibrate (or probe) and solve, all ranks being well
        _agreed(link, error)
        from ..plan.auto import auto_split
        solved, error = _attempt(cfg, lambda: auto_split(link, cfg, drafts[:1]))
        if solved is not None:
            fractions, predicted = solved
            cfg = dataclasses.replace(cfg, split=fractions, leave_empty=True)
    if rank == 0 and error is None:
        planned, error = _attempt(cfg, lambda: _manifest(cfg, size, drafts))
        if planned is not None:
            shared, tokenizer = planned
    _agreed(link, error, tokenizer)
    model, ranges, manifest, kv_cells, draft_vocab = link.bcast(shared)
    cfg = dataclasses.replace(cfg, draft_vocab=draft_vocab)
    if kv_cells:
        cfg = dataclasses.replace(cfg, spec=dataclasses.replace(cfg.spec, kv_size=kv_cells))
    return cfg, (model, ranges, manifest), tokenizer, drafts, predicted


def _agreed(link: Link, error: str | None, tokenizer: Tokenizer | None = None) -> None:
    """Collective: StartFailed on every rank if one failed (`error`: this rank's)."""
    _, failure = link.agree((link.rank, hostname(), os.getpid(), error))
    if failure:
        if tokenizer is not None:
            tokenizer.close()
        raise StartFailed(failure)


def _first_checks(cfg: JobConfig, check: Callable[[], None] | None, size: int):
    """Rank 0: `check`, then the settled config and the draft files (`size`: the job's
    ranks)."""
    if check is not None:
        check()
    return settle_drafts(cfg, size)


def _attempt(cfg: JobConfig, step: Callable[[], T]) -> tuple[T | None, str | None]:
    """(what `step` returns, None), or (None, the message of what it raised): a rank that
    fails a step of the start still takes part in the collective ones after it."""
    try:
        return step(), None
    except SETUP_ERRORS + (WeightsError, TransferError) as err:  # (auto: calibration's)
        return None, str(err)
    except Exception as err:
        return None, describe(err, cfg.output.verbose)


def job_kv_cells(cfg: JobConfig, tokenizer: Tokenizer) -> int:
    """The KV cells every stage of a `run` job reserves: what its generation can use, not
    what -c allows (llama.cpp zeroes, so keeps resident, every cell it reserves). A
    speculative strategy gets 4x the prompt plus -n (rejected tokens keep their cells: the
    ratio the default 4 x -c has), plus 512, in whole 256-cell blocks, at most 4 x -c; 0 (as
    configured) for serve, an explicit --kv-size, and strategies without speculation."""
    if cfg.request.prompt is None or cfg.spec.kv_size or not cfg.speculates:
        return 0
    cells = 4 * (len(prompt_tokens(cfg, tokenizer)) + cfg.request.n_predict) + 512
    return min(cfg.kv_size, -(-cells // 256) * 256)


def _manifest(cfg: JobConfig, size: int, drafts: Sequence[DraftFile]):
    """Rank 0: (model, ranges, Manifest, KV cells, --draft-vocab's K) of the job, and the
    target's tokenizer, opened once for the draft ranks' checks, the KV size and the head
    (head_setup)."""
    ranges, model = plan(cfg, size)
    n_pipeline = cfg.n_pipeline(size)
    digest = content_digest(model)
    needs = target_needs(model, digest, ranges, n_pipeline)
    tokenizer = Tokenizer(model)
    try:
        for i, rank in enumerate(range(n_pipeline, size)):
            needs[rank] = draft_need(draft_rank_file(drafts[i], tokenizer), cfg.drafts[i])
        kv_cells = job_kv_cells(cfg, tokenizer)
    except BaseException:
        tokenizer.close()
        raise
    manifest = Manifest(str(model), str(cfg.model), digest, needs)
    return (model, ranges, manifest, kv_cells, cfg.draft_vocab), tokenizer
