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
reports its own to the head before it returns. The CLI (runner.py) sits on top of this.
Progress (fetching, slicing) is logged at INFO by the modules doing it, tracebacks at DEBUG.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from typing import Callable, Iterator, Sequence

from .hierarchy import Level
from .hierarchy_remote import DraftRank
from ..model.llama_lib import LlamaError
from . import wakeup
from .mpi_transport import DraftLink, Link, RankFailed, WorkerLink, hostname
from ..model.sampling import Sampler, SamplingParams
from ..schedule.generation import Generation, Request
from ..schedule.transaction import seq_clear
from ..strategies import STRATEGIES
from ..model.partition import chain
from .worker import Idle, Worker
from .config import RunConfig
from .generate import driver_for
from .setup import SETUP_ERRORS, HeadSetup, head_setup, load_draft_rank_stage, load_stage, plan
from .trace import Trace


log = logging.getLogger(__name__)


class StartFailed(Exception):
    """A rank could not load its part of the job; the message names it."""


RUN_ERRORS = (RankFailed, LlamaError)          # expected while a job runs


def describe(err: Exception, verbose: int = 0, known: tuple = RUN_ERRORS) -> str:
    """The one-line report of an error: its message if it is of a `known` kind, else (a bug)
    its type too, and a hint unless `verbose`; its traceback is logged (DEBUG, shown by -v)."""
    log.debug("traceback of %s: %s", type(err).__name__, err, exc_info=err)
    if isinstance(err, known):
        return str(err)
    return f"internal error: {type(err).__name__}: {err}" + ("" if verbose else
                                                             " (run with -v for the traceback)")


def first_failure(statuses) -> str | None:
    for rank, host, _pid, error in statuses:
        if error:
            return error if rank == 0 else f"rank {rank} ({host}): {error}"
    return None


class Job:
    """One rank's part of a job started on COMM_WORLD."""

    def __init__(self, cfg: RunConfig, link: Link, stage, head: "Head | None", statuses,
                 ranges=None):
        self.cfg, self.link, self.stage, self.head, self.statuses = (cfg, link, stage, head,
                                                                     statuses)
        self.ranges = ranges

    @property
    def rank(self) -> int:
        return self.link.rank

    @property
    def is_head(self) -> bool:
        return self.link.rank == 0

    @classmethod
    def start(cls, cfg: RunConfig, check: Callable[[], None] | None = None) -> "Job":
        """Every rank: load this rank's part, then agree with the others that all are ready
        (a rank that failed ends the job everywhere with its message) and measure the clock
        offsets of the other ranks (for traces). `check` runs first on the head (e.g. that
        an output file is writable); what it raises fails the start."""
        link = Link()
        rank, size = link.rank, link.size
        stage, setup, ranges, error = None, None, None, None
        try:
            if rank == 0 and check is not None:
                check()
            if cfg.split == "auto":  # collective: calibrate (or probe) and solve
                from ..plan.auto import auto_split
                cfg = dataclasses.replace(cfg, split=auto_split(link, cfg), leave_empty=True)
            ranges, model = plan(cfg, size)
            n_pipeline = cfg.n_pipeline(size)
            if rank >= n_pipeline:
                stage = load_draft_rank_stage(cfg, model, rank, n_pipeline)
            else:
                stage = load_stage(cfg, model, ranges[rank], n_pipeline)
            if rank == 0:
                setup = head_setup(cfg, model, stage, size, chain(ranges[:n_pipeline]))
        except SETUP_ERRORS as err:
            error = str(err)
        except Exception as err:  # a bug: still take part in the gather, or the others hang
            error = describe(err, cfg.verbose)
        statuses = link.gather((rank, hostname(), os.getpid(), error))
        failure = link.bcast(first_failure(statuses) if rank == 0 else None)
        if failure:
            raise StartFailed(failure)
        offsets = link.clock_offsets()
        wakeup.connect(link)  # from now on a message wakes the rank waiting for it
        head = Head(cfg, setup, ranges, size, offsets or {}) if rank == 0 else None
        return cls(cfg, link, stage, head, statuses, ranges)

    def serve(self) -> int:
        """A worker or draft rank's role until the head shuts the job down: 0 when it ended
        normally, 1 after a failure (reported to the head, which ends the job)."""
        size = self.link.size
        if self.rank >= self.cfg.n_pipeline(size):
            link = DraftLink()
            n_pipeline = self.cfg.n_pipeline(size)
            role = DraftRank(link, Level(self.stage, self.cfg.n_batch), self.rank - n_pipeline,
                             range(n_pipeline, size), self.cfg.spec.draft)
        else:
            n_pipeline = self.cfg.n_pipeline(size)
            ranks = chain(self.ranges[:n_pipeline]) if self.ranges else list(range(n_pipeline))
            if self.rank in ranks:
                link = WorkerLink(n_ranks=n_pipeline, chain=ranks)
                role = Worker(link, self.stage, argmax_only=self.cfg.argmax_only)
            else:  # no layers: out of the chain, it waits for the end of the job
                link = WorkerLink(n_ranks=n_pipeline, chain=[0, self.rank])
                role = Idle(link)
        try:
            role.run()
            return 0
        except Exception as err:  # report to the head, which ends the job with the message
            link.report_error(describe(err, self.cfg.verbose))
            link.flush(timeout=5)
            return 1


class Head:
    """Rank 0: the tokenizer, pipeline and draft model(s) of a started job. Generations run
    one after another (`generate`, `stream`), each from its own Request (default: the job's
    prompt and -n) and sampling. Before each but the first, every rank's KV cells and the draft
    models' are cleared, so each generation computes as in a job of its own; run ids keep
    growing across generations (a rank takes a cancellation of an id it has passed as one of a
    run done, and a stage's abort flag holds the last id it was asked to abort)."""

    def __init__(self, cfg: RunConfig, setup: HeadSetup, ranges, size: int,
                 offsets: dict[int, float]):
        self.cfg, self.setup, self.ranges, self.size = cfg, setup, ranges, size
        self.offsets = offsets
        self.trace = Trace(cfg.trace) if cfg.trace else None
        self.gen: Generation | None = None
        self.generations = 0
        self.run_ids = itertools.count()  # one counter for every generation (and lane)

    @property
    def tokenizer(self):
        return self.setup.tokenizer

    def request(self, prompt: Sequence[int] | None = None, n_predict: int | None = None,
                ignore_eos: bool | None = None) -> Request:
        """A Request of this job: the job's prompt, -n and --ignore-eos unless given."""
        cfg = self.cfg
        return Request(tuple(self.setup.prompt if prompt is None else prompt),
                       cfg.n_predict if n_predict is None else n_predict, cfg.n_ctx,
                       cfg.ignore_eos if ignore_eos is None else ignore_eos)

    def generate(self, on_token: Callable[[int], None] = lambda t: None,
                 request: Request | None = None,
                 sampling: SamplingParams | None = None) -> Generation:
        """Generate from `request` (default: the job's) until a stop condition; `on_token`
        gets every accepted token as it is accepted. Returns the generation (tokens, timeline,
        counters, stop reason)."""
        self.gen = self._generation(on_token, request)
        cfg = self.cfg
        STRATEGIES[cfg.strategy](self.setup.pipeline, self.gen, Sampler(sampling or cfg.sampling),
                                 cfg, self.setup.drafter, self.setup.pool, trace=self.trace)
        return self.gen

    def stream(self, request: Request | None = None,
               sampling: SamplingParams | None = None) -> Iterator[int]:
        """A generation token by token as they are accepted (`self.gen` holds the rest);
        closing the iterator early cancels the generation (stop reason "cancelled") and
        drains its runs, so the next generation may follow."""
        self.gen = self._generation(lambda t: None, request)
        cfg = self.cfg
        yield from driver_for(cfg.strategy, self.setup.pipeline, self.gen,
                              Sampler(sampling or cfg.sampling), cfg, self.setup.drafter,
                              self.setup.pool, self.trace).stream()

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
        for s in stats:
            spans = s.pop("spans", [])
            if self.trace is not None:
                self.trace.rank_spans(s["rank"], spans, self.offsets.get(s["rank"], 0.0))
        if self.trace is not None:
            self.trace.close()
        return stats
