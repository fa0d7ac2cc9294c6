"""Weights travel with the job: only rank 0 needs the model files.

Collective, at start-up (Job.start), after rank 0 has planned the split:

1. rank 0 names, per rank, the file it loads (a Need: the stage cache key of its slice of the
   target, or of a draft model that runs on a rank of its own) and broadcasts the Manifest;
2. every other rank looks in its stage cache; failing that, if it has the model file itself
   (the same name or path) and its content digest is rank 0's, it cuts its slice from it as
   before; otherwise it asks for the file, or, if its cache holds a slice of the same model
   that shares one end with its new range (a job relaunched after a host was lost extends
   the survivors' ranges), for only the piece that slice lacks (model/slice_pieces.py);
3. rank 0 cuts (or reads from its own cache) every file asked for and streams it
   (transfer.py), to every asking rank at once; a piece is sent only if rank 0 finds that
   the slice assembled from it is the cut byte for byte, else the whole slice, saying why;
4. a rank that received a piece assembles its slice in its cache; every rank reports how it
   went: one failure ends the start on every rank with the message of the rank that failed.

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
from ...model.slice_pieces import Pieces, assemble_cached, find_pieces, refusal
from ...model.slicing import model_info, read_model, stage_size
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
    have, error, pieces = None, None, None
    if need is not None:
        try:
            have = _find_locally(need, manifest, own)
            if have is None and need.stage is not None:
                pieces = find_pieces(manifest.model_digest, need.stage)
            if pieces is not None:
                log.info("its cache holds layers [%d, %d): asking for layers [%d, %d) only",
                         pieces.old.first, pieces.old.last, pieces.piece.first,
                         pieces.piece.last)
        except (ModelError, OSError) as err:
            error = str(err)
    statuses, failure = link.agree((link.rank, hostname(), have is not None or need is None,
                                    error, pieces))
    if failure:
        raise WeightsError(failure)
    # {asking rank: the piece it is sent, or None: its whole file}; rank 0 also keeps the
    # size of the whole slice each piece stands for (for its log)
    asking, whole = _decide(manifest, statuses) if link.rank == 0 else (None, {})
    asking = link.bcast(asking)
    received, error = 0, None
    try:
        if link.rank == 0 and asking:
            _serve(link, manifest, asking, whole)
        elif link.rank in asking:
            have, received = _receive(link, need, pieces if asking[link.rank] else None)
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


def _decide(manifest: Manifest, statuses: list
            ) -> tuple[dict[int, StageRange | None], dict[int, int]]:
    """Rank 0: every asking rank and the piece it is sent (None: its whole file), a piece
    only where assembling the slice from it gives the cut (slice_pieces.refusal); and the
    size of the whole slice of each rank sent a piece."""
    asking, whole, source = {}, {}, None
    for rank, _, ok, _, pieces in statuses:
        if ok:
            continue
        asking[rank] = None
        if pieces is None:
            continue
        need = manifest.needs[rank]
        try:
            source = source or read_model(manifest.model)
            info = model_info(source, manifest.model)
            why = refusal(source, info, pieces.old, pieces.piece, need.stage)
            if not why:
                whole[rank] = stage_size(source, info, need.stage)
        except (ModelError, OSError) as err:
            why = str(err)
        if why:
            log.info("rank %d: sending its whole slice, not the piece [%d, %d) its cached "
                     "[%d, %d) lacks: %s", rank, pieces.piece.first, pieces.piece.last,
                     pieces.old.first, pieces.old.last, why)
        else:
            asking[rank] = pieces.piece
    return asking, whole


def _receive(link: Link, need: Need, pieces: Pieces | None) -> tuple[Path, int]:
    """A rank's side: its whole file, or the piece its cached slice lacks, from which it
    assembles its slice (path, bytes received)."""
    if pieces is None:
        return receive(link, stages_dir(), need.label)
    path, received = receive(link, stages_dir(), f"layers [{pieces.piece.first}, "
                             f"{pieces.piece.last}) for {need.label}")
    return assemble_cached(pieces, path, need.stage, need.key), received


def _serve(link: Link, manifest: Manifest, asking: dict[int, StageRange | None],
           whole: dict[int, int]) -> None:
    """Rank 0: send every asking rank its file or piece, all at once
    (PIPEINFER_WEIGHTS_AT_ONCE=k: k at a time, the largest first); raises if one could not
    be sent (the receivers are told)."""
    # (Served one at a time, the largest first, the last file to arrive would be the
    # quickest to load: each rank loads as soon as it has its file. All at once moves the
    # bytes sooner and reaches the first token as soon: experiments/bench_load.py.)
    ranks = list(asking)
    offers = deque(sorted(((r, *_offer(manifest, manifest.needs[r], asking[r]))
                           for r in ranks), key=lambda o: -o[1].size))
    t0 = time.monotonic()  # (the files are cut and hashed: what follows is the transfer)
    log.info("sending %s MB of weights to rank(s) %s%s", _mb(sum(o.size for _, o, _ in offers)),
             ", ".join(map(str, ranks)), _whole(whole, offers))
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


def _whole(whole: dict[int, int], offers) -> str:
    """What the log says rank 0 saves when it sends pieces: the size of the whole slices
    they stand for (`whole`: of each rank sent a piece; '' when it sends none)."""
    if not whole:
        return ""
    total = sum(whole.get(r, o.size) for r, o, _ in offers)
    return f" (pieces of slices: the whole slices would be {_mb(total)} MB)"


def _offer(manifest: Manifest, need: Need, piece: StageRange | None = None
           ) -> tuple[Offer, Path | None]:
    """The file rank 0 sends for `need`, or the `piece` of its slice (cut into its own
    cache first if not cut yet), and its offer; an offer carrying the error if it cannot be
    made."""
    key = need.key if piece is None else stage_key(manifest.model_digest, piece)
    try:
        path = Path(need.source) if need.stage is None else \
            stage_file(Path(manifest.model), piece or need.stage)
        return Offer(key, path.stat().st_size, content_digest(path)), path
    except (ModelError, OSError) as err:
        return Offer(key, 0, "", error=str(err)), None
