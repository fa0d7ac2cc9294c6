"""Calibration of a job's ranks (collective: every rank of the MPI job calls the same function).

Per rank: one target layer's and the output layer's time per step of 1, 2, 3, 4 and 8 tokens at the
rank's -t (measure.py), the layer's for a prompt chunk too, the draft model's time per token on the
head, free memory, and an MPI ping-pong with the next rank (the last rank: the head) of one token's
hidden state (round trip) and of 64 tokens' (bandwidth). Ranks are timed one after the other, the
others waiting politely, so no measurement shares a core with another rank's.
"""

from __future__ import annotations

import datetime
import logging
import statistics
import time
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from ..engine.transport.mpi import Link, hostname
from ..model.models import ModelError
from ..model.stage_cache import content_digest, stage_file
from ..engine.transport.wire import Tag
from . import cgroups, measure
from .profile import ModelId, NodeFigures, Profile

log = logging.getLogger(__name__)
T = TypeVar("T")

PING_ROUNDS = 12
BULK_TOKENS = 64
PROBE_CHANGE = 0.25   # a layer this much slower or faster than profiled: measure again


def model_id(path: Path, n_layer: int = 0) -> ModelId:
    return ModelId(path.name, content_digest(path)[:32], n_layer)


def from_rank0(link: Link, make: Callable[[], T],
               errors: tuple = (ModelError, OSError)) -> T:
    """Collective: what `make` returns on rank 0 (where the model files are), on every rank;
    one of `errors` it raises is raised on every rank, as a ModelError with its message."""
    answer = None
    if link.rank == 0:
        try:
            answer = ("ok", make())
        except errors as err:
            answer = ("error", str(err))
    kind, value = link.bcast(answer)
    if kind == "error":
        raise ModelError(value)
    return value


def calibration_slices(link: Link, model: Path, n_layer: int,
                       given: str | None = None) -> measure.Slices:
    """Collective: the calibration slices of rank 0's `model` as this rank's files, cut on
    rank 0 and sent to the ranks that lack them (engine/files/weights.py: only rank 0 needs the
    model file); `given` is the model this rank was given, a copy it may cut from."""
    from ..engine.files.weights import Manifest, obtain, slice_need

    def plan():
        ranges = measure.calibration_ranges(model, n_layer)
        digest = content_digest(model)
        return ranges, [Manifest(str(model), given or str(model), digest, {
            r: slice_need(digest, rng, f"calibration layers [{rng.first}, {rng.last}) of "
                          f"{model.name}")
            for r in range(1, link.size)}) for rng in ranges]

    ranges, manifests = from_rank0(link, plan)
    files = [obtain(link, manifest, own=given)[0] for manifest in manifests]
    if link.rank == 0:
        files = [stage_file(model, rng) for rng in ranges]
    return measure.Slices(files[0], ranges[0].n_layer, files[1])


def calibrate(link: Link, model: Path, n_layer: int, n_embd: int, threads: list[int],
              draft: Path | None = None, repack: bool = True,
              given: str | None = None) -> Profile | None:
    """Measure every rank; the profile on rank 0, None on the others. A rank that fails
    raises on every rank (the message names it). `model` and `draft` are rank 0's files."""
    rank, size = link.rank, link.size
    slices = calibration_slices(link, model, n_layer, given)
    figures, error = {}, None
    for turn in range(size):
        link.barrier()
        if turn == rank:
            try:
                figures = _measure_own(slices, threads[rank], draft if rank == 0
                                       else None, repack)
            except Exception as err:  # every rank must go on taking turns
                error = str(err) or type(err).__name__
    rtt_ms, mb_s = _links(link, n_embd)
    statuses = link.gather((rank, hostname(), figures, error, rtt_ms, mb_s))
    failure = link.bcast(_first_error(statuses) if rank == 0 else None)
    if failure:
        raise RuntimeError(failure)
    if rank != 0:
        return None
    nodes = tuple(NodeFigures(r, host, threads[r], link_rtt_ms=round(rtt, 4),
                              link_mb_s=round(bw, 1), **fig)
                  for r, host, fig, _, rtt, bw in statuses)
    return Profile(model_id(model, n_layer), model_id(draft) if draft else None, nodes,
                   datetime.datetime.now().isoformat(timespec="seconds"))


def _first_error(statuses) -> str | None:
    for rank, host, _fig, error, *_ in statuses:
        if error:
            return f"calibration failed on rank {rank} ({host}): {error}"
    return None


def _measure_own(slices: measure.Slices, threads: int, draft: Path | None,
                 repack: bool) -> dict:
    t0 = time.perf_counter()
    layer, output = measure.measure_layers(slices, threads, repack)
    fig = {"layer_ms": _rounded(layer), "output_ms": _rounded(output),
           "free_mb": measure.free_mb(), "cores": cgroups.cores()}
    if draft is not None:
        fig["draft_ms"] = round(measure.measure_draft(draft, threads), 3)
    log.info("calibrated in %.1f s: one layer %s ms, output %s ms", time.perf_counter() - t0,
             fig["layer_ms"], fig["output_ms"])
    return fig


def _rounded(table: dict) -> dict:
    return {b: round(ms, 4) for b, ms in table.items()}


def _links(link: Link, n_embd: int) -> tuple[float, float]:
    """(round trip ms of one token's hidden state, MB/s) from this rank to the next (the last
    rank: to the head), measured pair by pair; (0, 0) for a single rank."""
    rank, size = link.rank, link.size
    result = (0.0, 0.0)
    if size < 2:
        return result
    small = np.zeros(n_embd, np.float32)
    bulk = np.zeros(n_embd * BULK_TOKENS, np.float32)
    for sender in range(size):
        link.barrier()
        partner = (sender + 1) % size
        if rank == sender:
            t_small = _ping(link, partner, small)
            t_bulk = _ping(link, partner, bulk)
            extra = (t_bulk - t_small) / 2  # one way, seconds
            bw = (bulk.nbytes - small.nbytes) / extra / 1e6 if extra > 0 else 1e5
            result = (1e3 * t_small, min(bw, 1e5))
        elif rank == partner:
            for buf in (small, bulk):
                for _ in range(PING_ROUNDS):
                    got = link.recv_array(sender, Tag.CLOCK, np.float32)
                    link.isend(got, sender, Tag.CLOCK)
        link.flush()
    return result


def _ping(link: Link, partner: int, buf: np.ndarray) -> float:
    """Median round trip (seconds) of `buf` to `partner` and back."""
    times = []
    for _ in range(PING_ROUNDS):
        t0 = time.perf_counter()
        link.isend(buf, partner, Tag.CLOCK)
        link.recv_array(partner, Tag.CLOCK, np.float32)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe_changed(link: Link, profile: Profile, model: Path, n_layer: int,
                  threads: list[int], repack: bool = True,
                  given: str | None = None) -> str | None:
    """Collective quick probe: every rank times a layer again; on rank 0 a sentence naming
    the first rank whose speed changed by more than PROBE_CHANGE (None: the profile holds)."""
    rank = link.rank
    slices = calibration_slices(link, model, n_layer, given)
    now = None
    for turn in range(link.size):
        link.barrier()
        if turn == rank:
            try:
                now = measure.probe_layer_ms(slices, threads[rank], repack)
            except Exception as err:
                now = f"{err}"
    probes = link.gather((rank, now))
    verdict = None
    if rank == 0:
        for r, ms in probes:
            before = profile.nodes[r].layer_ms[1]
            if not isinstance(ms, float):
                verdict = f"the probe failed on rank {r}: {ms}"
            elif abs(ms - before) > PROBE_CHANGE * before:
                verdict = (f"rank {r} now takes {ms:.2f} ms a layer, profiled {before:.2f} ms")
            if verdict:
                break
    return link.bcast(verdict)
