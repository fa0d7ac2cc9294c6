"""Weights travel with the job: only rank 0 needs the model files.

Collective, at start-up (Job.start), after rank 0 has planned the split:

1. rank 0 names, per rank, the file it loads (a Need: the stage cache key of its slice of the
   target, or of a draft model that runs on a rank of its own) and broadcasts the Manifest;
2. every other rank looks in its stage cache; failing that, if it has the model file itself
   (the same name or path) and its content digest is rank 0's, it cuts its slice from it as
   before; otherwise it asks for the file;
3. rank 0 cuts (or reads from its own cache) every file asked for and streams it
   (transfer.py), to every asking rank at once;
4. every rank reports how it went: one failure ends the start on every rank with the message
   of the rank that failed.

A later start with the same model and split finds every file in the caches: nothing travels.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ...model.models import ModelError, resolve_model
from ...model.partition import StageRange
from ...model.stage_cache import cached_file, content_digest, stage_file, stage_key, stages_dir
from ..transport.backoff import Backoff
from ..transport.mpi import Link, hostname
from ..transport.transfer import PROGRESS_EVERY_S, Offer, Sender, TransferError, receive

log = logging.getLogger(__name__)

DRAFT_PREFIX = "draft-"
AT_ONCE_VAR = "PIPEINFER_WEIGHTS_AT_ONCE"  # ranks served at once (unset or 0: every one)


class WeightsError(RuntimeError):
    """A rank could not obtain its file; raised on every rank, naming the one that failed."""


@dataclass(frozen=True)
class Need:
    """The file one rank loads: a slice of the target (`stage`) or a whole draft model."""
    key: str
    label: str
    stage: StageRange | None = None
    source: str | None = None     # rank 0's path of a whole file (draft models)


@dataclass(frozen=True)
class Manifest:
    model: str            # the target as rank 0 resolved it
    model_name: str       # as given (-m): a registry name or a path
    model_digest: str
    needs: dict[int, Need]


def slice_need(digest: str, stage: StageRange, label: str) -> Need:
    """The slice `stage` of the model whose sha256 is `digest`."""
    return Need(stage_key(digest, stage), label, stage=stage)


def target_needs(model: Path, digest: str, ranges: list[StageRange],
                 n_pipeline: int) -> dict[int, Need]:
    """Rank 0: the slice of every pipeline rank after the head that has layers (`digest`:
    the model's sha256)."""
    return {r.rank: slice_need(digest, r, f"layers [{r.first}, {r.last}) of {model.name}")
            for r in ranges[1:n_pipeline] if r.n_layer > 0}


def draft_need(path: Path, name: str) -> Need:
    """Rank 0: a draft model file that a rank of its own loads whole."""
    return Need(DRAFT_PREFIX + content_digest(path)[:32], f"draft model {name}",
                source=str(path))


def obtain(link: Link, manifest: Manifest, own: str | None = None,
           confirm: bool = True) -> tuple[Path | None, int]:
    """Every rank: its file (None on rank 0, and on a rank that loads nothing) and the bytes
    it received; `own` is the model this rank was given (-m on its command line). Raises
    WeightsError on every rank if any rank lacks a file it cannot receive. A transfer that
    fails raises WeightsError on every rank too with `confirm`; without it, only on the ranks
    it failed on (TransferError), whose caller reports it to the others in a collective of
    its own: then a rank goes on (loads its file) while rank 0 still sends to the others."""
    need = manifest.needs.get(link.rank) if link.rank else None
    have, error = None, None
    if need is not None:
        try:
            have = _find_locally(need, manifest, own)
        except (ModelError, OSError) as err:
            error = str(err)
    statuses, failure = link.agree((link.rank, hostname(), have is not None or need is None,
                                    error))
    if failure:
        raise WeightsError(failure)
    asking = link.bcast([r for r, _, ok, _ in statuses if not ok] if link.rank == 0 else None)
    received, error = 0, None
    try:
        if link.rank == 0 and asking:
            _serve(link, manifest, asking)
        elif link.rank in asking:
            have, received = receive(link, stages_dir(), need.label)
    except (TransferError, ModelError, OSError) as err:
        if not confirm:
            raise TransferError(str(err)) from None
        error = str(err)
    if confirm:
        _, failure = link.agree((link.rank, hostname(), True, error))
        if failure:
            raise WeightsError(failure)
    return have, received


def _find_locally(need: Need, manifest: Manifest, given: str | None) -> Path | None:
    """The rank's file from its own disk: cached, or cut from its own copy of the model
    when that copy is rank 0's (same content digest)."""
    hit = cached_file(need.key)
    if hit is not None or need.stage is None:
        return hit
    own = _own_copy(manifest, given)
    if own is None:
        return None
    digest = content_digest(own)
    if digest != manifest.model_digest:
        log.warning("its copy of the model, %s, differs from rank 0's (sha256 %s... against "
                    "%s...): receiving its slice from rank 0", own, digest[:12],
                    manifest.model_digest[:12])
        return None
    return stage_file(own, need.stage)


def _own_copy(manifest: Manifest, given: str | None) -> Path | None:
    """This rank's copy of the target (the model it was given, else rank 0's by name or
    path), if any; never fetched: the weights come from rank 0."""
    for value in dict.fromkeys(v for v in (given, manifest.model_name, manifest.model) if v):
        try:
            return resolve_model(value, fetch_missing=False)
        except ModelError:
            continue
    return None


def _serve(link: Link, manifest: Manifest, ranks: list[int]) -> None:
    """Rank 0: send every asking rank its file, all at once (PIPEINFER_WEIGHTS_AT_ONCE=k: k
    at a time, the largest first); raises if one could not be sent (the receivers are
    told)."""
    # (Served one at a time, the largest first, the last file to arrive would be the
    # quickest to load: each rank loads as soon as it has its file. All at once moves the
    # bytes sooner and reaches the first token as soon: experiments/bench_load.py.)
    offers = deque(sorted(((r, *_offer(manifest, manifest.needs[r])) for r in ranks),
                          key=lambda o: -o[1].size))
    t0 = time.monotonic()  # (the files are cut and hashed: what follows is the transfer)
    log.info("sending %s MB of weights to rank(s) %s", _mb(sum(o.size for _, o, _ in offers)),
             ", ".join(map(str, ranks)))
    at_once = int(os.environ.get(AT_ONCE_VAR, "0") or 0) or len(offers)
    senders: list[Sender] = []
    backoff, last = Backoff(limit=1e-3), t0
    while offers or not all(s.done for s in senders):
        while offers and sum(not s.done for s in senders) < at_once:
            senders.append(Sender(link, *offers.popleft()))
        for sender in senders:
            sender.step()
        backoff.wait()
        if time.monotonic() - last >= PROGRESS_EVERY_S:
            last = time.monotonic()
            log.info("weights: %s", "; ".join(_progress(s, last - t0) for s in senders))
    elapsed = max(time.monotonic() - t0, 1e-9)
    sent = sum(s.sent_bytes for s in senders)
    log.info("sent %s MB of weights in %.1f s (%s MB/s)", _mb(sent), elapsed,
             _mb(sent / elapsed))
    errors = [f"sending rank {s.dest} {s.offer.key}.gguf: {s.error}" for s in senders
              if s.error and not s.reported]
    if errors:  # (a receiver's own failure it reports itself, naming its host)
        raise TransferError("; ".join(errors))


def _progress(sender: Sender, elapsed: float) -> str:
    """'rank 2: 120 of 276 MB, 110 MB/s, ETA 1 s' (what rank 0 has handed to MPI)."""
    size, sent = sender.offer.size, sender.sent_bytes
    if sender.done:
        return f"rank {sender.dest}: " + ("failed" if sender.error else f"{_mb(size)} MB done")
    rate = sent / max(elapsed, 1e-9)
    eta = f"{(size * sender.tries - sent) / rate:.0f} s" if rate else "?"
    return f"rank {sender.dest}: {_mb(sent)} of {_mb(size)} MB, {_mb(rate)} MB/s, ETA {eta}"


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f}" if n >= 1e8 else f"{n / 1e6:.1f}"


def _offer(manifest: Manifest, need: Need) -> tuple[Offer, Path | None]:
    """The file rank 0 sends for `need` (cut into its own cache first if it is a slice not
    cut yet) and its offer; an offer carrying the error if it cannot be made."""
    try:
        path = Path(need.source) if need.stage is None else \
            stage_file(Path(manifest.model), need.stage)
        return Offer(need.key, path.stat().st_size, content_digest(path)), path
    except (ModelError, OSError) as err:
        return Offer(need.key, 0, "", error=str(err)), None
