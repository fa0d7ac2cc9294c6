"""The roles of a pipeinfer MPI job as a library: no printing, no exit codes.

    job = Job.start(cfg)              # every rank: load its part, wait until all are ready
    if job.is_head:
        gen = job.head.generate(on_token=print)    # tokens as they are accepted
        gen = job.head.generate(request=job.head.request(other_prompt))  # and more
        stats = job.head.shutdown()
    else:
        job.serve()                   # a worker or draft rank, until the head shuts down

`Job.start` raises StartFailed on every rank when any rank failed to load (the message names
the rank); failures while running raise on the head (RankFailed names the rank), and a worker
reports its own to the head before it returns. The CLI (cli/runner.py) sits on top of this.
Progress (fetching, slicing) is logged at INFO by the modules doing it, tracebacks at DEBUG.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..config.job import JobConfig
from ..engine.drafting.hierarchy import Level
from ..engine.drafting.hierarchy_remote import DraftRank
from ..engine.files.weights import WeightsError, obtain
from ..engine.head.generate import Drafting, driver_for
from ..engine.head.trace import Trace
from ..engine.transport import wakeup
from ..engine.transport.clock_sync import clock_offsets
from ..engine.transport.draft_link import DraftLink
from ..engine.transport.mpi import Link, hostname
from ..engine.transport.transfer import TransferError
from ..engine.transport.worker_link import WorkerLink
from ..engine.worker.loop import Idle, Worker
from ..model.llama_lib import LlamaError
from ..model.partition import chain
from ..model.row_costs import marginal, time_rows
from ..model.sampling import Sampler, SamplingParams
from ..plan.cgroups import memory_limit_mb
from ..report.metrics import rss_mb
from ..schedule.generation import Generation, Request
from ..schedule.transaction import seq_clear
from .plan_phase import StartFailed, describe, plan_phase
from .preload import Preload
from .restore import draft_store, replicas, restore, stage_copies, token_store
from .setup import (SETUP_ERRORS, HeadSetup, head_setup, load_draft_rank_stage, load_stage,
                    own_stage_file, stage_config)
from .startup import Marks

__all__ = ["Head", "Job", "StartFailed", "describe"]


log = logging.getLogger(__name__)


def _load(cfg: JobConfig, early: Preload, path, rng, n_pipeline: int):
    """The rank's stage: the one loaded early if the plan gives it that one (preload.py)."""
    stage = early.take(path, rng, stage_config(cfg, rng)) or load_stage(cfg, path, rng,
                                                                           n_pipeline)
    early.note(path, rng)
    return stage


def _load_part(cfg: JobConfig, link: Link, early: Preload, shared, tokenizer, drafts) -> tuple:
    """This rank's part obtained (its cache, its own copy of the model, else from rank 0) and
    loaded, and on the head its setup: (stage, setup, error, bytes received). An error the
    other ranks must hear of is returned, not raised: they would wait for this rank forever."""
    model, ranges, manifest = shared
    rank, size = link.rank, link.size
    stage, setup, error, received = None, None, None, 0
    try:
        path, received = obtain(link, manifest, own=cfg.model, confirm=False)
        n_pipeline = cfg.n_pipeline(size)
        if rank >= n_pipeline:
            stage = load_draft_rank_stage(cfg, path, rank)
        elif rank == 0:
            stage = _load(cfg, early, own_stage_file(model, ranges[0], n_pipeline),
                          ranges[0], n_pipeline)
            setup = head_setup(cfg, model, stage, size, drafts, chain(ranges[:n_pipeline]),
                               tokenizer)
        elif path is not None:
            stage = _load(cfg, early, path, ranges[rank], n_pipeline)
    except WeightsError as err:  # raised on every rank alike: the start fails here
        raise StartFailed(str(err)) from None
    except SETUP_ERRORS + (TransferError,) as err:
        error = str(err)
    except Exception as err:  # a bug: still take part in the gather, or the others hang
        error = describe(err, cfg.output.verbose)
    if setup is None and tokenizer is not None:  # (head_setup did not take it)
        tokenizer.close()
    return stage, setup, error, received


def _time_rows(cfg: JobConfig, stage, rank: int, size: int,
               error: str | None) -> tuple[float, ...]:
    """A worker's stage timed on runs of a few rows (model/row_costs.py), where pipeinfer's
    drafter will use the figures; () on other ranks, otherwise, or if the stage cannot take
    such runs."""
    if (error or stage is None or not 0 < rank < cfg.n_pipeline(size)
            or cfg.strategy != "pipeinfer" or not cfg.spec.row_costs):
        return ()
    try:
        return time_rows(stage)
    except LlamaError as err:
        log.warning("rank %d: its stage was not timed on runs of a few rows: %s", rank, err)
        return ()


class Job:
    """One rank's part of a job started on COMM_WORLD."""

    def __init__(self, cfg: JobConfig, link: Link, stage, head: "Head | None", statuses,
                 ranges=None, predicted: dict | None = None):
        self.cfg, self.link, self.stage, self.head, self.statuses = (cfg, link, stage, head,
                                                                     statuses)
        self.ranges = ranges
        self.predicted = predicted   # the planner's, with --layer-split auto (on rank 0)
        self.kept = None             # where this rank copies its KV cells (restore.py)

    @property
    def rank(self) -> int:
        return self.link.rank

    @property
    def is_head(self) -> bool:
        return self.link.rank == 0

    def ready_line(self) -> str:
        """Where every rank runs and what it holds, for the log (launchers name a dead rank by
        pid and host only; after a failover the front's log shows the new split here)."""
        ranges = self.ranges or []

        def held(r: int) -> str:
            if r >= len(ranges):
                return ", a draft model"
            return f", layers [{ranges[r].first},{ranges[r].last})" if ranges[r].n_layer else ""
        return "ready: " + "; ".join(f"rank {r} pid {pid} on {host}{held(r)}"
                                     for r, host, pid, *_ in self.statuses)

    @classmethod
    def start(cls, cfg: JobConfig, check: Callable[[], None] | None = None) -> "Job":
        """Every rank: rank 0 plans the split, every other rank obtains its file (from its
        cache or its own copy of the model, else from rank 0: weights.py), every rank loads
        its part; then all agree that all are ready (a rank that failed ends the job
        everywhere with its message) and the head measures the clock offsets of the other
        ranks (for traces). `check` runs first on the head (e.g. that an output file is
        writable); what it raises fails the start."""
        marks = Marks()
        marks.mark("imported")
        link = Link()
        early = Preload(link.rank, link.size,
                        lambda path, rng, cfg=cfg: load_stage(cfg, path, rng,
                                                              cfg.n_pipeline(link.size)))
        cfg, shared, tokenizer, drafts, predicted = plan_phase(link, cfg, check)
        marks.mark("planned")
        model, ranges, manifest = shared
        rank, size = link.rank, link.size
        stage, setup, error, received = _load_part(cfg, link, early, shared, tokenizer, drafts)
        marks.mark("loaded early" if early.used else "loaded")
        statuses, failure = link.agree((rank, hostname(), os.getpid(), error, received,
                                        rss_mb(), memory_limit_mb(),
                                        _time_rows(cfg, stage, rank, size, error)))
        if failure:
            raise StartFailed(failure)
        offsets = clock_offsets(link)
        layers = stage if rank < cfg.n_pipeline(size) else None
        kept = stage_copies(layers, (ranges[rank].first, ranges[rank].last) if layers else None,
                            manifest.model_digest)
        marks.mark("agreed")
        restored = restore(link, layers, kept, cfg.slots)
        sending = replicas(link, kept, ranges[:cfg.n_pipeline(size)], model)
        marks.mark("restored")
        marks.report(link)
        wakeup.connect(link)  # from now on a message wakes the rank waiting for it
        head = Head(cfg, setup, ranges, size, offsets or {}) if rank == 0 else None
        if head is not None:
            head.weights_received = [s[4] for s in statuses]
            head.restored, head.tokens_kept = restored, token_store()
            head.drafts_kept = draft_store(cfg, drafts)
            setup.pipeline.kept = kept.own if kept is not None else None
            setup.pipeline.row_costs = marginal([s[7] for s in statuses])
        job = cls(cfg, link, stage, head, statuses, ranges, predicted)
        job.kept = sending
        return job

    def serve(self) -> int:
        """A worker or draft rank's role until the head shuts the job down: 0 when it ended
        normally, 1 after a failure (reported to the head, which ends the job)."""
        size = self.link.size
        if self.rank >= self.cfg.n_pipeline(size):
            link = DraftLink()
            n_pipeline = self.cfg.n_pipeline(size)
            name = Path(self.cfg.drafts[self.rank - n_pipeline]).name  # (not its cache key)
            role = DraftRank(link, Level(self.stage, self.cfg.n_batch, name=name),
                             self.rank - n_pipeline,
                             range(n_pipeline, size), self.cfg.spec.draft)
        else:
            n_pipeline = self.cfg.n_pipeline(size)
            ranks = chain(self.ranges[:n_pipeline]) if self.ranges else list(range(n_pipeline))
            if self.rank in ranks:
                link = WorkerLink(n_ranks=n_pipeline, chain=ranks)
                role = Worker(link, self.stage, argmax_only=self.cfg.argmax_only,
                              kept=self.kept)
            else:  # no layers: out of the chain, it waits for the end of the job
                link = WorkerLink(n_ranks=n_pipeline, chain=[0, self.rank])
                role = Idle(link)
        try:
            role.run()
            return 0
        except Exception as err:  # report to the head, which ends the job with the message
            link.report_error(describe(err, self.cfg.output.verbose))
            link.flush(timeout=5)
            return 1


class Head:
    """Rank 0: the tokenizer, pipeline and draft model(s) of a started job. Generations run
    one after another (`generate`, `stream`), each from its own Request (default: the job's
    prompt and -n) and sampling. Before each but the first, every rank's KV cells and the draft
    models' are cleared, so each generation computes as in a job of its own; run ids keep
    growing across generations (a rank takes a cancellation of an id it has passed as one of a
    run done, and a stage's abort flag holds the last id it was asked to abort)."""

    def __init__(self, cfg: JobConfig, setup: HeadSetup, ranges, size: int,
                 offsets: dict[int, float]):
        self.cfg, self.setup, self.ranges, self.size = cfg, setup, ranges, size
        self.offsets = offsets
        self.trace = Trace(cfg.output.trace) if cfg.output.trace else None
        self.gen: Generation | None = None
        self.generations = 0
        self.run_ids = itertools.count()  # one counter for every generation (and lane)
        self.weights_received: list[int] = []  # bytes of weights each rank received at start
        self.restored = {}       # requests whose cells the ranks took back (job/restore.py)
        self.tokens_kept = None  # where the head writes the tokens of kept cells
        self.drafts_kept = None  # where its draft model keeps its contexts

    @property
    def tokenizer(self):
        return self.setup.tokenizer

    def request(self, prompt: Sequence[int] | None = None, n_predict: int | None = None,
                ignore_eos: bool | None = None, resumed: Sequence[int] = ()) -> Request:
        """A Request of this job: the job's prompt, -n and --ignore-eos unless given;
        `resumed`: the tokens an earlier job generated for it before it ended (the generation
        goes on after them, as it would have: n_predict counts them)."""
        cfg = self.cfg
        return Request(tuple(self.setup.prompt if prompt is None else prompt),
                       cfg.request.n_predict if n_predict is None else n_predict, cfg.n_ctx,
                       cfg.request.ignore_eos if ignore_eos is None else ignore_eos,
                       resumed=tuple(int(t) for t in resumed))

    def generate(self, on_token: Callable[[int], None] = lambda t: None,
                 request: Request | None = None,
                 sampling: SamplingParams | None = None) -> Generation:
        """Generate from `request` (default: the job's) until a stop condition; `on_token`
        gets every accepted token as it is accepted. Returns the generation (tokens, timeline,
        counters, stop reason)."""
        self.gen = self._generation(on_token, request)
        cfg = self.cfg
        driver_for(cfg.strategy, self.setup.pipeline, self.gen, self._sampler(sampling), cfg,
                   Drafting(self.setup.drafter), self.setup.pool, self.trace).run()
        return self.gen

    def stream(self, request: Request | None = None,
               sampling: SamplingParams | None = None) -> Iterator[int]:
        """A generation token by token as they are accepted (`self.gen` holds the rest);
        closing the iterator early cancels the generation (stop reason "cancelled") and
        drains its runs, so the next generation may follow."""
        self.gen = self._generation(lambda t: None, request)
        cfg = self.cfg
        yield from driver_for(cfg.strategy, self.setup.pipeline, self.gen,
                              self._sampler(sampling), cfg, Drafting(self.setup.drafter),
                              self.setup.pool, self.trace).stream()

    def _sampler(self, sampling: SamplingParams | None) -> Sampler:
        """The current generation's sampler (its draws keyed by position: a resumed
        generation draws on from where it stopped)."""
        return Sampler(sampling or self.cfg.request.sampling,
                       position=len(self.gen.request.resumed))

    def _generation(self, on_token: Callable[[int], None],
                    request: Request | None) -> Generation:
        if self.generations:
            self._clear()
        self.generations += 1
        return Generation(request or self.request(), self.setup.tokenizer.is_eog, on_token,
                          run_ids=self.run_ids)

    def _clear(self) -> None:
        """Every rank's KV cells, the draft models' and the partitions as at the start."""
        if self.cfg.draft_ranks:
            raise RuntimeError("a job with draft ranks of its own runs one generation")
        self.setup.pipeline.kv([seq_clear()])
        drafters = self.setup.drafter
        for drafter in drafters if isinstance(drafters, (list, tuple)) else [drafters]:
            if drafter is not None:
                drafter.reset()
        self.setup.pool = self.cfg.pool()

    def check_ranks(self) -> None:
        """Raise RankFailed if a worker has reported a failure (while no generation runs)."""
        transport = self.setup.pipeline.transport
        if transport is not None:
            transport.check_errors()

    def shutdown(self) -> list[dict]:
        """Stop every worker; their statistics (rank order). Their stage spans go into the
        trace, moved to the head's clock."""
        stats = self.setup.pipeline.shutdown()
        for store in (self.tokens_kept, self.drafts_kept, self.setup.pipeline.kept):
            if store is not None:   # (an orderly end: nothing resumes)
                store.clear()
                store.flush()
        for s in stats:
            spans = s.pop("spans", [])
            if self.trace is not None:
                self.trace.rank_spans(s["rank"], spans, self.offsets.get(s["rank"], 0.0))
        if self.trace is not None:
            self.trace.close()
        return stats
