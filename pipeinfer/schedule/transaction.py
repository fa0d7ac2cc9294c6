"""Pipeline transactions (paper IV-A-2, DESIGN.md section 3) and their wire encoding.

A transaction is a begin message (a fixed-size int64 header carrying its type) followed by
its payload messages under that type's tag. Workers read begin messages in the order the
head sent them, so every rank applies transactions in the head's order. Cancellations travel
the other way, head -> last rank -> ... -> rank 1, on their own tag.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

import numpy as np

HEADER_LEN = 6  # int64: type, run_id, n_tokens, n_items, flags, slot


class TxType(enum.IntEnum):
    DECODE = 1
    KV = 2          # a list of KV operations, applied in order
    CANCEL = 3
    SHUTDOWN = 4
    LOGITS = 5      # last rank -> head
    ERROR = 6       # any rank -> head: a rank failed; the job must end
    BUSY = 7        # head -> ranks -> head: each rank appends its busy seconds (serve metrics)


class KvOpType(enum.IntEnum):
    KV_SEQ_CP = 1
    KV_SEQ_RM = 2
    KV_SEQ_KEEP = 3
    KV_SEQ_COMPACT = 4  # move a sequence's cells to the front of the cache, in cell order


class Tag(enum.IntEnum):
    """MPI tags: one for all begin messages, one per payload kind."""
    BEGIN = 1
    DECODE_META = 2
    ACTIVATIONS = 3
    KV_OPS = 4
    CANCEL = 5
    RESULT = 6      # last rank -> head: int64 header of a run's result
    LOGITS = 7      # last rank -> head: its logits (absent when the run was cancelled)
    ERROR = 8       # any rank -> head: a pickled message
    STATS = 9       # worker -> head at shutdown: a pickled dict
    DRAFT = 10      # between PipeSpec's draft ranks and the head: int64 [kind, arg, tokens...]
    CLOCK = 11      # start-up clock offsets: head <-> each rank, float64 ping/pong
    BUSY = 12       # float64: busy seconds of the ranks passed so far (TxType.BUSY)
    WEIGHTS = 13    # rank 0 -> a rank at start-up: chunks of a file it lacks (engine/startup/weights.py)
    WEIGHTS_CTL = 14  # both ways at start-up: a file transfer's header, checksum and answer


class DecodeFlag(enum.IntFlag):
    NONE = 0
    SPECULATIVE = 1
    SKIPPED = 2     # no activations follow: the run was cancelled before this rank computed it
    STATES = 4      # the last stage returns its final hidden states (embeddings), not logits


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


def encode_kv_ops(ops: Sequence[KvOp]) -> np.ndarray:
    return np.array([[op.kind, op.seq, op.dst, op.p0, op.p1, op.slot] for op in ops],
                    dtype=np.int32).reshape(-1)


def decode_kv_ops(buf: np.ndarray) -> list[KvOp]:
    return [KvOp(KvOpType(int(r[0])), int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]))
            for r in buf.reshape(-1, 6)]


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

    def encode_meta(self) -> np.ndarray:
        """int32: positions, per-token seq counts, output flags, then all seq ids."""
        n = self.n_tokens
        flat = [s for seqs in self.seq_ids for s in seqs]
        meta = np.empty(3 * n + len(flat), dtype=np.int32)
        meta[:n] = self.positions
        meta[n:2 * n] = [len(s) for s in self.seq_ids]
        meta[2 * n:3 * n] = self.logit_rows
        meta[3 * n:] = flat
        return meta

    @classmethod
    def from_wire(cls, header: np.ndarray, meta: np.ndarray) -> "DecodeTx":
        run_id, n = int(header[1]), int(header[2])
        counts = meta[n:2 * n]
        seq_ids, at = [], 3 * n
        for c in counts:
            seq_ids.append(tuple(int(s) for s in meta[at:at + c]))
            at += int(c)
        return cls(run_id, tuple(int(p) for p in meta[:n]), tuple(seq_ids),
                   tuple(bool(x) for x in meta[2 * n:3 * n]),
                   bool(int(header[4]) & DecodeFlag.SPECULATIVE), int(header[5]),
                   bool(int(header[4]) & DecodeFlag.STATES))

    def header(self, skipped: bool = False, meta_len: int = 0) -> np.ndarray:
        flags = (DecodeFlag.SPECULATIVE if self.speculative else DecodeFlag.NONE) | \
                (DecodeFlag.SKIPPED if skipped else DecodeFlag.NONE) | \
                (DecodeFlag.STATES if self.states else DecodeFlag.NONE)
        return make_header(TxType.DECODE, self.run_id, self.n_tokens, meta_len, int(flags),
                           self.slot)


def make_header(kind: TxType, run_id: int = -1, n_tokens: int = 0, n_items: int = 0,
                flags: int = 0, slot: int = 0) -> np.ndarray:
    return np.array([kind, run_id, n_tokens, n_items, flags, slot], dtype=np.int64)


class ResultFlag(enum.IntFlag):
    NONE = 0
    SKIPPED = 1     # cancelled along the pipeline: no payload
    ARGMAX = 2      # greedy sampling: the payload is each row's argmax, not its logits
    STATES = 4      # the payload is each row's final hidden state (DecodeFlag.STATES)


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
