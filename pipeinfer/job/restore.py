"""A served job's start after a failure: every rank takes back the KV cells it kept of the
requests the last job was generating (model/kept_cells.py), so that they resume without
evaluating their whole context again.

Collective, on every rank, once all are ready: the head reads its token files (which
requests were under way and the tokens their cells are of) and names a slot for each, up to
the job's slots, most recent first; every rank holding target layers puts its copy of each
(its own, or one assembled from its last stage's and its neighbours' copies after the split
changed: job/assemble.py) into that slot's sequence 0 and says how many leading positions it holds (0, with the
reason, when its copy is missing, damaged, or of another model, split or build); the head
takes, per request, the positions every rank holds, whose tokens' digests agree with its
own, and every rank keeps those in the slot (none where the head takes none). Copies of
requests not named are removed. What the head keeps (Restored) goes to its
slots (engine/head/lanes.py), where the request, when the front sends it again, evaluates
only what follows them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from ..engine.worker.replicas import Replicas
from ..model.balance import layer_bytes
from ..model.handover import replica_plan
from ..model.kept_cells import (DRAFT, REPLICAS, TOKENS, KeptCells, identity_of, load_into,
                                token_digest)
from ..model.llama_lib import system_info
from ..model.slicing import read_model
from .assemble import StageCopies

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    """A request whose cells every rank took back: in `slot`'s sequence 0, of `tokens`
    (from position 0); its prompt had `n_prompt` tokens."""
    key: int
    slot: int
    tokens: tuple[int, ...]
    n_prompt: int


def stamp_of(stage, model_digest: str) -> tuple:
    """What, besides its layers, makes a stage's cells the bits they are: the model, the
    settings that choose llama.cpp's kernels and batches, the build and the CPU's features."""
    c = stage.config
    return (model_digest, c.n_ctx, c.n_batch, c.n_threads, c.repack, llama_cpp.__version__,
            system_info())


def stage_copies(stage, layers: tuple[int, int], model_digest: str) -> StageCopies | None:
    """The copies a rank holding `stage` (layers [first, last)) keeps and can take back,
    None when nothing is kept."""
    if stage is None:
        return None
    stamp = stamp_of(stage, model_digest)
    own = KeptCells.for_job(identity_of(*stamp, *layers), layers)
    if own is None:
        return None
    return StageCopies(own, KeptCells.for_job(b"", sub=REPLICAS), stamp)


def replicas(link, copies: StageCopies | None, ranges, model) -> Replicas | None:
    """Collective: where a worker's KV_SEQ_SAVE and _DROP go: its copies, and those it sends
    the ranks that would take over its layers (model/handover.py), and keeps of its
    neighbours' (rank 0 weighs the layers of `model`, the target's file); from now on they
    are written on a thread of their own. Nothing (not even a collective) when the job
    keeps nothing, which the environment says alike on every rank (KeptCells.for_job)."""
    if KeptCells.for_job(b"") is None:
        return None
    if copies is not None:
        copies.in_background()
    plan = link.bcast(replica_plan(ranges, *layer_bytes(read_model(model), ranges[-1].last))
                      if link.rank == 0 else None)
    if copies is None:
        return None
    rank = link.rank
    parts = [(dest, lo, hi, identity_of(*copies.stamp, lo, hi))
             for dest, lo, hi in plan.get(rank, [])]
    senders = [r for r, sent in plan.items() if any(dest == rank for dest, *_ in sent)]
    return Replicas(copies.own, copies.held, parts, senders)


def token_store() -> KeptCells | None:
    return KeptCells.for_job(identity_of(TOKENS))


def draft_store(cfg, drafts) -> KeptCells | None:
    """Where the head's draft model keeps its context of each request (engine/head/kept.py),
    None when nothing is kept or there is no draft model. A copy is taken back only by the
    same draft file (path, size, time), llama.cpp build and CPU; not bound to the job's
    settings or the draft's vocabulary cut (both follow the pipeline's depth, which a lost
    host changes; a cut changes the output head only, not the cells): a draft's cells choose
    guesses, never the answer, and llama.cpp refuses cells that do not fit its context
    (Drafter.take_back then reads the context again)."""
    if not drafts or KeptCells.for_job(b"") is None:
        return None
    path = Path(drafts[0].path).resolve()
    st = path.stat()
    return KeptCells.for_job(identity_of(DRAFT, str(path), st.st_size, st.st_mtime_ns,
                                         llama_cpp.__version__, system_info()), sub=DRAFT)


def restore(link, stage, kept: StageCopies | None, n_slots: int) -> dict[int, Restored]:
    """Collective (every rank): the requests whose cells were taken back (on the head, by
    key; empty elsewhere)."""
    heads, named = {}, []
    if kept is not None:
        kept.own.sweep()
        if kept.held is not None:
            kept.held.sweep()
    if link.rank == 0:
        tokens = token_store()
        if tokens is not None:
            tokens.sweep()
            heads, named = _named(tokens, n_slots)
    named = link.bcast(named)
    held = _take_back(stage, kept, named)
    reports = link.gather(held)
    restored = _agreed(heads, named, reports) if link.rank == 0 else {}
    kept_n = link.bcast({r.slot: len(r.tokens) for r in restored.values()})
    if held is not None:   # every slot as the head sees it: the agreed cells, or none
        for _, slot in named:
            if kept_n.get(slot):
                stage.seq_rm(0, kept_n[slot], -1, slot=slot)
            else:
                stage.clear(slot)
    return restored


def _named(tokens: KeptCells, n_slots: int) -> tuple[dict, list[tuple[int, int]]]:
    """The head's token files (key -> Kept) and (key, slot) for each request to take back."""
    heads, named = {}, []
    for key in tokens.keys():
        copy, why = tokens.read(key)
        if copy is None or len(named) >= n_slots:
            log.info("kept cells of request %d: not used (%s)", key,
                     why or f"more requests than the job's {n_slots} slots")
            tokens.drop(key)
            continue
        heads[key] = copy
        named.append((key, len(named)))
    return heads, named


def _take_back(stage, kept: StageCopies | None, named) -> list | None:
    """This rank's copies of the named requests in their slots: [(key, n, digest, why)];
    None for a rank without target layers."""
    if stage is None:
        return None
    held = []
    for key, slot in named:
        copy, why = kept.copy_of(key) if kept is not None else (None, "nothing kept")
        if copy is not None and not load_into(stage, slot, 0, copy):
            copy, why = None, "llama.cpp refused it"
        held.append((key, copy.n, copy.digest, "") if copy else (key, 0, 0, why))
    if kept is not None:   # (copies of other stages of the named requests: removed when
        names = {key for key, _ in named}   # those end, engine/worker/replicas.py)
        for store in (kept.own, kept.held):
            if store is not None:
                store.drop_every(but=names)
    return held


def _agreed(heads: dict, named, reports) -> dict[int, Restored]:
    restored = {}
    for i, (key, slot) in enumerate(named):
        tokens = heads[key].tokens
        n, why = len(tokens), ""
        for rank, held in enumerate(reports):
            if held is None:
                continue
            _, n_r, digest, reason = held[i]
            if n_r and n_r <= len(tokens) and token_digest(tokens[:n_r]) != digest:
                n_r, reason = 0, "of other tokens"
            if n_r < n:
                n, why = n_r, why or (f"rank {rank}: {reason}" if reason else "")
        log.info("kept cells of request %d: %d of its %d tokens on every rank%s", key, n,
                 len(tokens), f" ({why})" if why else "")
        if n:
            restored[key] = Restored(key, slot, tokens[:n], heads[key].n_prompt)
    return restored
