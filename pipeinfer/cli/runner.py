"""`pipeinfer run` on every rank, as the command line presents it: start the job
(job/roles.py), then stream the head's tokens to stdout and report (summary line on stderr,
--json, --csv), or serve as a worker; errors become one line and an exit code.

Tokens, --json and the summary line are results: written to stdout and stderr directly.
Everything else (progress, notices, errors) is logged; cli.setup_logging decides what shows."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from ..config.job import JobConfig
from ..job.roles import Head, Job, StartFailed, describe
from ..report.metrics import CsvRow, append_csv, peak_rss_mb, rss_mb
from ..engine.transport.mpi import Link, abort_job, hostname
from ..report.summary import result_json, summary_line
from ..model.tokenizer import TextStream

__all__ = ["main", "abandon_start"]

log = logging.getLogger(__name__)
FRESH_LINE = {"fresh_line": True}  # a message that may follow streamed text on the terminal


def main(cfg: JobConfig) -> int:
    """This rank's part of the run; the exit status."""
    rank = Link().rank
    try:
        csv = cfg.output.csv
        job = Job.start(cfg, check=(lambda: _check_writable(csv)) if csv else None)
    except StartFailed as err:
        if rank == 0:  # every rank has the message: one line of it is enough
            log.error("%s", err)
        return 1
    except KeyboardInterrupt:
        return _interrupted(rank)
    if rank == 0 and job.link.size > 1:  # launchers name a dead rank by pid and host only
        log.info("%s", job.ready_line())
    try:
        return _run_head(job.cfg, job.head) if job.is_head else job.serve()
    except KeyboardInterrupt:
        return _interrupted(rank)


def _interrupted(rank: int) -> int:
    if rank == 0:  # every rank got the signal: one notice
        log.warning("interrupted", extra=FRESH_LINE)
    return 130


def abandon_start(message: str) -> None:
    """Take part in Job.start's handshake as a rank that failed before main() (on its
    command line) with `message`, so that every rank of the job ends: the others would wait
    for this one forever. Rank 0 leaves the printing to its caller."""
    link = Link()
    link.agree((link.rank, hostname(), os.getpid(), message))


def _check_writable(path: str) -> None:
    """Fail early, before any work, if the results CSV cannot be appended to."""
    try:
        with open(path, "a"):
            pass
    except OSError as err:
        raise ValueError(f"cannot write CSV file {path}: {err.strerror}") from None


def _run_head(cfg: JobConfig, head: Head) -> int:
    stream = TextStream(head.tokenizer)
    rss_trace: list[float] = []
    n_tokens = 0

    def on_token(token: int) -> None:
        nonlocal n_tokens
        if not cfg.output.json:
            sys.stdout.write(stream.push(token))
            sys.stdout.flush()
        n_tokens += 1
        if n_tokens % 100 == 0:
            rss_trace.append(round(rss_mb(), 1))

    t0 = time.perf_counter()
    try:
        gen = head.generate(on_token)
        worker_stats = head.shutdown()
    except Exception as err:
        log.error("%s", describe(err, cfg.output.verbose), extra=FRESH_LINE)
        if head.size > 1:
            abort_job(1)  # workers may be waiting on a rank that is gone: end them all
        return 1
    wall = time.perf_counter() - t0
    if not cfg.output.json:
        sys.stdout.write(stream.finish() + "\n")
        sys.stdout.flush()
    _stop_notice(cfg, gen.stop_reason)
    stats = [{"rank": 0, "busy_s": head.setup.pipeline.busy_s, "wall_s": wall,
              "rss_trace_mb": rss_trace, "peak_rss_mb": peak_rss_mb()}] + worker_stats
    gen.counters.runs_aborted_midway = sum(s.get("aborted", 0) for s in worker_stats)
    result = result_json(cfg, gen, head.setup, head.ranges, stats, wall)
    result["weights_received_bytes"] = head.weights_received
    _report(cfg, result)
    return 0


def _stop_notice(cfg: JobConfig, reason: str) -> None:
    if reason == "context":
        log.warning("stopped at the context limit (%d tokens, -c)", cfg.n_ctx)
    elif reason == "kv-cache":
        log.warning("stopped: the KV cache (%d cells, --kv-size) is full", cfg.kv_size)


def _report(cfg: JobConfig, result: dict) -> None:
    if cfg.output.json:
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    if cfg.output.summary:
        sys.stderr.write(summary_line(result) + "\n")
    if cfg.output.csv:
        append_csv(cfg.output.csv, CsvRow(**{k: result[k] for k in CsvRow.__dataclass_fields__
                                      if k in result}))
