"""`pipeinfer calibrate`, `pipeinfer plan` and `pipeinfer simulate`: their options and output;
the work is in this package's other modules."""

from __future__ import annotations

import json
import sys

import click

from ..cli import Failure, RankedCommand, _verbosity, setup_logging
from ..cli_options import DRAFT_MODEL_HELP, STRATEGY_NAMES, parse_threads


@click.command(cls=RankedCommand, context_settings={"show_default": True})
@click.option("-m", "--model", required=True, help="Target model: a GGUF path or cached name.")
@click.option("-md", "--model-draft", "draft", default=None,
              help="Draft model the head will run (its time per token is measured on rank 0).")
@click.option("-t", "--threads", default="1", callback=parse_threads,
              help="Threads per rank, as `run` will use them: one number, or one per rank.")
@click.option("--profile", type=click.Path(dir_okay=False), default=None,
              help="Also write the profile (JSON) here. It is always kept in the cache for "
                   "these hosts, threads and models, where `run --layer-split auto` finds it.")
@click.option("--repack/--no-repack", default=True,
              help="Time the target's layers repacked (as run's default for iterative, "
                   "speculative and pipeinfer) or in the plain layout (specpipe, pipespec).")
@_verbosity()
def calibrate(model, draft, threads, profile, repack, verbose, quiet):
    """Measure every rank of the job (launch it like `run`: mpiexec -n N pipeinfer calibrate
    ...): one target layer's and the output layer's time for steps of 1, 2, 4 and 8 tokens at
    the rank's -t, the draft model's time per token on the head, free memory, and the round
    trip and bandwidth of the link to the next rank (MPI ping-pong of a hidden state). Ranks
    are timed one at a time. Rank 0 prints a table and the profile's path."""
    from ..engine.mpi_transport import Link
    from ..model.models import ModelError, resolve_model
    from ..model.slicing import model_info, read_model
    from .calibrate import calibrate as measure, model_id
    from .profile import cache_path

    link = Link()
    setup_logging(verbose, quiet, rank=link.rank)
    _handshake(link)
    if len(threads) not in (1, link.size):
        raise Failure(f"-t has {len(threads)} values for {link.size} ranks", 2)
    per_rank = [threads[r] if len(threads) > 1 else threads[0] for r in range(link.size)]
    try:
        path = resolve_model(model)
        draft_path = resolve_model(draft) if draft else None
        info = model_info(read_model(path), path)
        result = measure(link, path, info.n_layer, info.n_embd, per_rank, draft_path, repack)
    except (ModelError, ValueError, RuntimeError, OSError) as err:
        raise Failure(str(err))
    if result is None:
        return
    cached = cache_path(result.hosts, per_rank, model_id(path, info.n_layer),
                        model_id(draft_path) if draft_path else None)
    for where in filter(None, (profile, cached)):
        result.save(where)
    click.echo(_profile_table(result))
    click.echo(f"profile: {profile or cached}")


def _handshake(link) -> None:
    """The start-up handshake of `run` (runner.abandon_start's other side), so that a rank
    that failed on its command line ends every rank."""
    import os

    from ..engine.job import first_failure
    from ..engine.mpi_transport import hostname

    statuses = link.gather((link.rank, hostname(), os.getpid(), None))
    failure = link.bcast(first_failure(statuses) if link.rank == 0 else None)
    if failure:
        sys.exit(1)


def _profile_table(profile) -> str:
    sizes = sorted(profile.nodes[0].layer_ms)
    head = ("rank host            thr  " + " ".join(f"layer@{b:<3}" for b in sizes)
            + "  output@1  draft  free MB  rtt ms   MB/s")
    rows = [head]
    for n in profile.nodes:
        rows.append(f"{n.rank:<4} {n.host[:15]:15} {n.threads:>3}  "
                    + " ".join(f"{n.layer_ms[b]:9.3f}" for b in sizes)
                    + f"  {n.output_ms[sizes[0]]:8.3f}  {n.draft_ms:5.1f}  {n.free_mb:7.0f}"
                    + f"  {n.link_rtt_ms:6.3f}  {n.link_mb_s:5.0f}")
    return "\n".join(rows)
