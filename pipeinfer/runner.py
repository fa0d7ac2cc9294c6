"""`pipeinfer run` on every rank: set up the rank's stage, agree that all ranks are ready, then
run the head's strategy (rank 0) or the worker loop (ranks 1..N-1)."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import llama_lib
from .embedding import Embedder
from .schedule.generation import Generation, Request
from .head import Pipeline
from .llama_lib import LlamaError
from .metrics import CsvRow, append_csv, rss_mb
from .models import ModelError, check_gguf, resolve_model
from .hierarchy import Level
from .hierarchy_remote import DraftRank, RemoteHierarchy
from .mpi_transport import (DraftLink, HeadTransport, Link, RankFailed, WorkerLink, abort_job,
                            hostname)
from .partition import PartitionError, StageRange, even_split, partition
from .report import summary_line, result_json
from .sampling import Sampler, SamplingParams
from .slicing import model_info, read_model
from .stage import Stage, StageConfig
from .stage_cache import stage_file
from .drafter import Drafter
from .engine.trace import Trace
from .partition_pool import PartitionPool
from .strategies import MULTI_DRAFT, NEEDS_DRAFT, STRATEGIES, SpecOptions
from .tokenizer import TextStream, Tokenizer
from .worker import Worker

SETUP_ERRORS = (ModelError, PartitionError, LlamaError, ValueError, OSError)


class UsageError(Exception):
    """A problem with the command line or inputs; reported without a traceback."""


@dataclass(frozen=True)
class RunConfig:
    model: str
    prompt: str
    n_predict: int = 128
    n_ctx: int = 2048
    n_batch: int = 512
    draft: str | tuple[str, ...] | None = None   # several (smallest first) for pipespec
    strategy: str = "iterative"
    split: tuple[float, ...] | None = None   # the target's fractions, one per pipeline rank
    draft_ranks: int = 0                     # pipespec: ranks of their own for the drafts
    threads: tuple[int, ...] = (1,)
    sampling: SamplingParams = SamplingParams()
    spec: SpecOptions = SpecOptions()
    ignore_eos: bool = False
    chat: bool = False
    csv: str | None = None
    json: bool = False
    verbose: int = 0
    label: str = ""
    repack: bool = True
    trace: str | None = None

    @property
    def drafts(self) -> tuple[str, ...]:
        """The draft models given (-md may be repeated), smallest first."""
        if not self.draft:
            return ()
        return (self.draft,) if isinstance(self.draft, str) else tuple(self.draft)

    def n_pipeline(self, size: int) -> int:
        """The target pipeline's ranks (0..n-1); the draft ranks follow them."""
        return size - self.draft_ranks

    def threads_for(self, rank: int) -> int:
        return self.threads[rank] if len(self.threads) > 1 else self.threads[0]

    @property
    def speculates(self) -> bool:
        return self.strategy in NEEDS_DRAFT

    def pool(self) -> PartitionPool | None:
        if self.strategy == "specpipe":  # one partition: the tree's beam slots
            return PartitionPool(1, self.spec.tree_width)
        return PartitionPool(self.spec.partitions, self.spec.n_parallel) if self.speculates \
            else None

    @property
    def kv_size(self) -> int:
        """KV cells per stage. Speculative strategies never reuse a cell within a generation
        (partition_pool explains why), so they need room for rejected tokens too."""
        if not self.speculates:
            return self.n_ctx
        return self.spec.kv_size or 4 * self.n_ctx


@dataclass
class HeadSetup:
    tokenizer: Tokenizer
    prompt: list[int]
    pipeline: Pipeline
    drafter: Drafter | None
    pool: PartitionPool | None


def main(cfg: RunConfig) -> int:
    link = Link()
    rank, size = link.rank, link.size
    say = _progress(rank, cfg.verbose)
    llama_lib.set_log_echo(cfg.verbose >= 2)
    setup, stage, error = None, None, None
    try:
        if rank == 0 and cfg.csv:
            _check_writable(cfg.csv)
        ranges, model = _plan(cfg, size, say)
        n_pipeline = cfg.n_pipeline(size)
        if rank >= n_pipeline:
            stage = _load_draft_rank_stage(cfg, model, rank, n_pipeline)
        else:
            stage = _load_stage(cfg, model, ranges[rank], n_pipeline, say)
        if rank == 0:
            setup = _head_setup(cfg, model, stage, size)
    except SETUP_ERRORS as err:
        error = str(err)
    except Exception as err:  # a bug: still take part in the gather, or the others hang
        error = _internal_error(err, cfg.verbose)
    statuses = link.gather((rank, hostname(), os.getpid(), error))
    failure = link.bcast(_first_failure(statuses) if rank == 0 else None)
    if failure:
        if rank == 0:
            print(f"pipeinfer: error: {failure}", file=sys.stderr)
        return 1
    if rank == 0 and size > 1:  # launchers name a dead rank by pid and host only
        say("ready: " + "; ".join(f"rank {r} pid {pid} on {host}" for r, host, pid, _ in statuses))
    try:
        if rank >= cfg.n_pipeline(size):
            return _run_draft_rank(stage, cfg, size)
        if rank != 0:
            return _run_worker(stage, cfg, size)
        return _run_head(cfg, setup, ranges, size)
    except KeyboardInterrupt:
        if rank == 0:
            print("\npipeinfer: interrupted", file=sys.stderr)
        return 130


def _run_worker(stage: Stage, cfg: RunConfig, size: int) -> int:
    link = WorkerLink(n_ranks=cfg.n_pipeline(size))
    try:
        Worker(link, stage, argmax_only=cfg.sampling.greedy).run()
        return 0
    except Exception as err:  # report to the head, which ends the job with the message
        link.report_error(_describe(err, cfg.verbose))
        link.flush(timeout=5)
        return 1


def _run_draft_rank(stage: Stage, cfg: RunConfig, size: int) -> int:
    link = DraftLink()
    n_pipeline = cfg.n_pipeline(size)
    level = Level(stage, cfg.n_batch)
    try:
        DraftRank(link, level, link.rank - n_pipeline, range(n_pipeline, size),
                  cfg.spec.draft).run()
        return 0
    except Exception as err:  # report to the head, which ends the job with the message
        link.report_error(_describe(err, cfg.verbose))
        link.flush(timeout=5)
        return 1


def abandon_start(message: str) -> None:
    """Take part in main()'s start-up handshake as a rank that failed before main() (on its
    command line) with `message`, so that every rank of the job ends: the others would wait
    for this one forever. Rank 0 leaves the printing to its caller."""
    link = Link()
    statuses = link.gather((link.rank, hostname(), os.getpid(), message))
    link.bcast(_first_failure(statuses) if link.rank == 0 else None)


def _describe(err: Exception, verbose: int) -> str:
    """The one-line report of a failure while running; its traceback only with -v."""
    if not isinstance(err, (RankFailed, LlamaError)):
        return _internal_error(err, verbose)
    if verbose:
        traceback.print_exc()
    return str(err)


def _internal_error(err: Exception, verbose: int) -> str:
    """The one-line report of an unexpected exception (a bug); its traceback only with -v."""
    if verbose:
        traceback.print_exc()
    return f"internal error: {type(err).__name__}: {err}" + ("" if verbose else
                                                             " (run with -v for the traceback)")


def _check_writable(path: str) -> None:
    """Fail early, before any work, if the results CSV cannot be appended to."""
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise ValueError(f"cannot write CSV file {path}: {err.strerror}") from None


def _first_failure(statuses) -> str | None:
    for rank, host, _pid, error in statuses:
        if error:
            return error if rank == 0 else f"rank {rank} ({host}): {error}"
    return None


def _progress(rank: int, verbose: int) -> Callable[[str], None]:
    def say(message: str) -> None:
        if rank == 0 or verbose:
            print(f"pipeinfer[{rank}]: {message}", file=sys.stderr, flush=True)
    return say


def _plan(cfg: RunConfig, size: int, say) -> tuple[list[StageRange], Path]:
    if cfg.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {cfg.strategy!r}")
    if cfg.strategy in NEEDS_DRAFT and not cfg.draft:
        raise ValueError(f"strategy {cfg.strategy} needs a draft model (-md)")
    fractions = list(cfg.split) if cfg.split else even_split(size)
    if cfg.draft_ranks:
        _check_draft_ranks(cfg, size, len(fractions))
    elif len(fractions) != size:
        raise PartitionError(f"--layer-split has {len(fractions)} fractions but the job has "
                             f"{size} ranks; give one fraction per rank")
    if len(cfg.threads) not in (1, size):
        raise ValueError(f"-t has {len(cfg.threads)} values for {size} ranks")
    model = resolve_model(cfg.model, progress=say)
    info = model_info(read_model(model), model)
    return partition(info.n_layer, fractions), model


def _check_draft_ranks(cfg: RunConfig, size: int, n_target: int) -> None:
    if cfg.strategy != "pipespec":
        raise PartitionError("draft models on ranks of their own ('/' in --layer-split) are "
                             "for --strategy pipespec only")
    if cfg.draft_ranks != len(cfg.drafts):
        raise PartitionError(f"--layer-split gives {cfg.draft_ranks} draft rank(s) but "
                             f"{len(cfg.drafts)} draft model(s) are given (-md); give /1 "
                             "for each, or none to run them in the head process")
    if n_target + cfg.draft_ranks != size:
        raise PartitionError(f"--layer-split asks for {n_target} target rank(s) and "
                             f"{cfg.draft_ranks} draft rank(s), {n_target + cfg.draft_ranks} "
                             f"in all, but the job has {size} ranks")


def _load_draft_rank_stage(cfg: RunConfig, model: Path, rank: int, n_pipeline: int) -> Stage:
    """The draft model of a draft rank (the -md numbered rank - n_pipeline), checked against
    the target's vocabulary."""
    tokenizer = Tokenizer(model)
    try:
        return _load_drafter(cfg, tokenizer, cfg.drafts[rank - n_pipeline],
                             threads=cfg.threads_for(rank)).stage
    finally:
        tokenizer.close()


def _load_stage(cfg: RunConfig, model: Path, rng: StageRange, size: int, say) -> Stage | None:
    if rng.n_layer == 0:
        return None
    pool = cfg.pool()
    config = StageConfig(n_ctx=cfg.kv_size, n_batch=cfg.n_batch,
                         n_seq_max=pool.n_seq if pool else 1, n_threads=cfg.threads_for(rng.rank),
                         repack=cfg.repack)
    label = f"rank {rng.rank} layers [{rng.first},{rng.last})"
    if size == 1:
        return Stage(model, config, final=True, label=label)
    return Stage(stage_file(model, rng, say), config, final=rng.final, label=label)


def _head_setup(cfg: RunConfig, model: Path, stage: Stage | None, size: int) -> HeadSetup:
    tokenizer = Tokenizer(model)
    text = tokenizer.apply_chat_template(cfg.prompt) if cfg.chat else cfg.prompt
    prompt = tokenizer.tokenize(text)
    if not prompt or not cfg.prompt:
        raise ValueError("the prompt is empty")
    if cfg.n_predict <= 0:
        raise ValueError(f"-n must be positive (got {cfg.n_predict})")
    if len(prompt) >= cfg.n_ctx:
        raise ValueError(f"the prompt has {len(prompt)} tokens but the context (-c) holds "
                         f"{cfg.n_ctx}; raise -c or shorten the prompt")
    if len(prompt) + cfg.n_predict > cfg.n_ctx:
        raise ValueError(f"the context (-c {cfg.n_ctx}) cannot hold the {len(prompt)} prompt "
                         f"tokens plus {cfg.n_predict} to generate (-n); raise -c or lower -n")
    n_pipeline = cfg.n_pipeline(size)
    if cfg.draft_ranks:
        drafter = RemoteHierarchy(DraftLink(), range(n_pipeline, size),
                                  ahead=cfg.spec.draft * cfg.spec.max_runs,
                                  limit=min(cfg.n_ctx, len(prompt) + cfg.n_predict))
    else:
        drafter = _load_drafters(cfg, tokenizer) if cfg.speculates else None
    transport = HeadTransport(tokenizer.n_vocab, n_ranks=n_pipeline) if n_pipeline > 1 else None
    embed = None if n_pipeline == 1 else Embedder(model)
    return HeadSetup(tokenizer, prompt,
                     Pipeline(embed, stage, transport, whole_model=n_pipeline == 1), drafter,
                     cfg.pool())


def _load_drafters(cfg: RunConfig, tokenizer: Tokenizer) -> Drafter | list[Drafter]:
    """The draft model; for strategies taking several (pipespec), the list of them, smallest
    first. Other strategies use the first -md."""
    if cfg.strategy in MULTI_DRAFT:
        return [_load_drafter(cfg, tokenizer, d) for d in cfg.drafts]
    return _load_drafter(cfg, tokenizer, cfg.drafts[0])


def _load_drafter(cfg: RunConfig, tokenizer: Tokenizer, draft: str,
                  threads: int | None = None) -> Drafter:
    try:
        path = resolve_model(draft)
        check_gguf(path)
    except ModelError as err:
        raise ModelError(f"draft model (-md): {err}") from None
    config = StageConfig(n_ctx=cfg.kv_size, n_batch=cfg.n_batch,
                         n_seq_max=(cfg.spec.tree_width + 1 if cfg.strategy == "specpipe"
                                    else cfg.spec.n_parallel),
                         n_threads=threads or cfg.threads_for(0))
    _check_same_vocabulary(Path(draft).name, path, tokenizer)
    stage = Stage(path, config, final=True, label="draft model")
    return Drafter(stage, cfg.n_batch)


def _check_same_vocabulary(name: str, draft_path: Path, target: Tokenizer) -> None:
    draft = Tokenizer(draft_path)
    try:
        if draft.n_vocab != target.n_vocab:
            raise ValueError(f"the draft model {name} has {draft.n_vocab} tokens in its "
                             f"vocabulary but the target has {target.n_vocab}; they must share "
                             "one vocabulary")
        for token in range(target.n_vocab):
            if draft.piece(token) != target.piece(token):
                raise ValueError(f"the draft model {name} and the target disagree on token "
                                 f"{token} ({draft.piece(token)!r} vs {target.piece(token)!r}); "
                                 "they must share one vocabulary")
    finally:
        draft.close()


def _run_head(cfg: RunConfig, setup: HeadSetup, ranges: list[StageRange], size: int) -> int:
    stream = TextStream(setup.tokenizer)
    rss_trace: list[float] = []

    def on_token(token: int) -> None:
        if not cfg.json:
            sys.stdout.write(stream.push(token))
            sys.stdout.flush()
        if len(gen.tokens) % 100 == 0:
            rss_trace.append(round(rss_mb(), 1))

    request = Request(tuple(setup.prompt), cfg.n_predict, cfg.n_ctx, cfg.ignore_eos)
    gen = Generation(request, setup.tokenizer.is_eog, on_token)
    t0 = time.perf_counter()
    trace = Trace(cfg.trace) if cfg.trace else None
    try:
        STRATEGIES[cfg.strategy](setup.pipeline, gen, Sampler(cfg.sampling), cfg,
                                 setup.drafter, setup.pool, trace=trace)
        worker_stats = setup.pipeline.shutdown()
    except Exception as err:
        print(f"\npipeinfer: error: {_describe(err, cfg.verbose)}", file=sys.stderr, flush=True)
        if size > 1:
            abort_job(1)  # workers may be waiting on a rank that is gone: end them all
        return 1
    finally:
        if trace is not None:
            trace.close()
    wall = time.perf_counter() - t0
    if not cfg.json:
        sys.stdout.write(stream.finish() + "\n")
        sys.stdout.flush()
    if gen.stop_reason == "context":
        print(f"pipeinfer: stopped at the context limit ({cfg.n_ctx} tokens, -c)", file=sys.stderr)
    elif gen.stop_reason == "kv-cache":
        print(f"pipeinfer: stopped: the KV cache ({cfg.kv_size} cells, --kv-size) is full",
              file=sys.stderr)
    stats = [{"rank": 0, "busy_s": setup.pipeline.busy_s, "wall_s": wall,
              "rss_trace_mb": rss_trace}] + worker_stats
    gen.counters.runs_aborted_midway = sum(s.get("aborted", 0) for s in worker_stats)
    result = result_json(cfg, gen, setup, ranges, stats, wall)
    if cfg.json:
        print(json.dumps(result))
    print(summary_line(result), file=sys.stderr)
    if cfg.csv:
        append_csv(cfg.csv, CsvRow(**{k: result[k] for k in CsvRow.__dataclass_fields__
                                      if k in result}))
    return 0
