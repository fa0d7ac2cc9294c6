"""Pipeline transactions (paper IV-A-2, DESIGN.md section 3) as the head's scheduler issues
them: a run's decode (DecodeTx), KV operations (KvOp), and what comes back (RunResult).
Their encoding on the wire is engine/transport/wire.py's."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class KvOpType(enum.IntEnum):
    KV_SEQ_CP = 1
    KV_SEQ_RM = 2
    KV_SEQ_KEEP = 3
    KV_SEQ_COMPACT = 4  # move a sequence's cells to the front of the cache, in cell order
    KV_SEQ_SAVE = 5     # copy a request's cells to the rank's disk (model/kept_cells.py)
    KV_SEQ_DROP = 6     # remove that copy
    KV_CTX_SEED = 7     # empty a context, give it a sequence's cells of another (refill.py)


ALL_SEQS = -1  # a KV operation's sequence meaning every sequence (seq_clear)


@dataclass(frozen=True)
class KvOp:
    kind: KvOpType
    seq: int            # source (cp) or target (rm, keep)
    dst: int = -1       # destination (cp)
    p0: int = -1
    p1: int = -1
    slot: int = 0       # the stage's context (serve: one per request generated at once)

    def __repr__(self) -> str:
        at = f"@{self.slot}" if self.slot else ""
        if self.kind == KvOpType.KV_SEQ_CP:
            return f"cp({self.seq}->{self.dst}, [{self.p0},{self.p1})){at}"
        if self.kind == KvOpType.KV_SEQ_RM:
            if self.seq == ALL_SEQS:
                return f"rm(all){at}"
            return f"rm({self.seq}, [{self.p0},{self.p1})){at}"
        if self.kind == KvOpType.KV_SEQ_COMPACT:
            return f"compact({self.seq}){at}"
        if self.kind == KvOpType.KV_SEQ_SAVE:
            return f"save({self.seq} as {self.dst}, {self.p0} cells){at}"
        if self.kind == KvOpType.KV_SEQ_DROP:
            return f"drop({self.dst})"
        if self.kind == KvOpType.KV_CTX_SEED:
            return f"seed({self.seq} from @{self.dst}, {self.p1} cells){at}"
        return f"keep({self.seq}){at}"


def seq_cp(src: int, dst: int, p0: int = -1, p1: int = -1) -> KvOp:
    return KvOp(KvOpType.KV_SEQ_CP, src, dst, p0, p1)


def seq_rm(seq: int, p0: int = -1, p1: int = -1) -> KvOp:
    return KvOp(KvOpType.KV_SEQ_RM, seq, -1, p0, p1)


def seq_clear() -> KvOp:
    """Remove every cell of every sequence: the cache as a new context has it (llama.cpp's
    seq_rm with sequence -1 matches any sequence), before a job's next generation."""
    return KvOp(KvOpType.KV_SEQ_RM, ALL_SEQS)


def seq_keep(seq: int) -> KvOp:
    return KvOp(KvOpType.KV_SEQ_KEEP, seq)


def seq_compact(seq: int) -> KvOp:
    """Move the cells of `seq`, the only sequence left in the cache, to cells 0..n-1 (in
    their cell order, which is their position order: see engine/head/prompt_cache.py), so that
    the next batch goes right after them, as it would in a cache that never held anything
    else: attention then adds the cells up in the order llama.cpp alone would."""
    return KvOp(KvOpType.KV_SEQ_COMPACT, seq)


def seq_save(seq: int, key: int, n: int, digest: int) -> KvOp:
    """Every rank copies `seq`'s cells to its disk as request `key`'s, which then holds
    cells of its first `n` tokens (whose digest is `digest`): model/kept_cells.py."""
    return KvOp(KvOpType.KV_SEQ_SAVE, seq, key, n, digest)


def ctx_seed(seq: int, src: int, n: int = -1) -> KvOp:
    """The context this operation is for is emptied, then takes `seq`'s cells of context
    `src` at positions below `n` (every one with n < 0), in their cell order from cell 0:
    as a context that computed only those cells holds them (Stage.seed)."""
    return KvOp(KvOpType.KV_CTX_SEED, seq, src, -1, n)


def seq_drop(key: int) -> KvOp:
    """Every rank removes its copy of request `key`'s cells."""
    return KvOp(KvOpType.KV_SEQ_DROP, -1, key)


@dataclass(frozen=True)
class DecodeTx:
    """Configuration of one run's decode: per-token positions, sequence ids and output rows."""
    run_id: int
    positions: tuple[int, ...]
    seq_ids: tuple[tuple[int, ...], ...]
    logit_rows: tuple[bool, ...]
    speculative: bool = False
    slot: int = 0       # the stage's context it decodes in (KvOp.slot)
    states: bool = False   # the last stage returns its hidden states (DecodeFlag.STATES)

    @property
    def n_tokens(self) -> int:
        return len(self.positions)

    @property
    def n_outputs(self) -> int:
        return sum(self.logit_rows)

@dataclass(frozen=True)
class RunResult:
    """What comes back to the head for one run: logits for its output rows (or, under greedy
    sampling, just each row's argmax: 4 bytes instead of 4 x n_vocab; for an embedding, each
    row's final hidden state), or nothing if the run was cancelled somewhere along the
    pipeline."""
    run_id: int
    logits: np.ndarray | None
    argmax: np.ndarray | None = None
    states: np.ndarray | None = None

    @property
    def cancelled(self) -> bool:
        return self.logits is None and self.argmax is None and self.states is None

    def token(self, row: int, sampler) -> int:
        """The token the sampler picks from output row `row`."""
        if self.argmax is not None:
            return int(self.argmax[row])
        return sampler.sample(self.logits[row])
