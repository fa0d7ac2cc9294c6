"""The pipeline's messages on the wire (MPI): a transaction is a begin message (a fixed-size
int64 header carrying its type) followed by its payload messages under that type's tag.
Workers read begin messages in the order the head sent them, so every rank applies
transactions in the head's order. Cancellations travel the other way, head -> last rank ->
... -> rank 1, on their own tag. The transactions themselves are schedule/transaction.py's."""

from __future__ import annotations

import enum
from typing import Sequence

import numpy as np

from ...schedule.transaction import DecodeTx, KvOp, KvOpType

HEAD = 0        # rank 0: the head
HEADER_LEN = 6  # int64: type, run_id, n_tokens, n_items, flags, slot


class TxType(enum.IntEnum):
    DECODE = 1
    KV = 2          # a list of KV operations, applied in order
    CANCEL = 3
    SHUTDOWN = 4
    LOGITS = 5      # last rank -> head
    ERROR = 6       # any rank -> head: a rank failed; the job must end
    BUSY = 7        # head -> ranks -> head: each rank appends its busy seconds, CPU and memory


class Tag(enum.IntEnum):
    """MPI tags: one for all begin messages, one per payload kind."""
    BEGIN = 1
    DECODE_META = 2
    ACTIVATIONS = 3
    KV_OPS = 4
    CANCEL = 5
    RESULT = 6      # last rank -> head: int64 header of a run's result (then each row's
                    # argmax, under greedy sampling: ResultFlag.ARGMAX)
    LOGITS = 7      # last rank -> head: its logits or states (absent: cancelled, or argmax)
    ERROR = 8       # any rank -> head: a pickled message
    STATS = 9       # worker -> head at shutdown: a pickled dict
    DRAFT = 10      # between PipeSpec's draft ranks and the head: int64 [kind, arg, tokens...]
    CLOCK = 11      # start-up clock offsets: head <-> each rank, float64 ping/pong
    BUSY = 12       # float64: each rank passed so far: busy s, CPU s, RSS MB (TxType.BUSY)
    WEIGHTS = 13    # rank 0 -> a rank at start-up: chunks of a file it lacks (files/weights.py)
    WEIGHTS_CTL = 14  # both ways at start-up: a file transfer's header, checksum and answer
    REPLICA = 15    # worker -> a neighbour: a pickled copy of some of its layers' KV cells


class DecodeFlag(enum.IntFlag):
    NONE = 0
    SPECULATIVE = 1
    SKIPPED = 2     # no activations follow: the run was cancelled before this rank computed it
    STATES = 4      # the last stage returns its final hidden states (embeddings), not logits


class ResultFlag(enum.IntFlag):
    NONE = 0
    SKIPPED = 1     # cancelled along the pipeline: no payload
    ARGMAX = 2      # greedy sampling: each row's argmax, after the header in its message
    STATES = 4      # the payload is each row's final hidden state (DecodeFlag.STATES)



def make_header(kind: TxType, run_id: int = -1, n_tokens: int = 0, n_items: int = 0,
                flags: int = 0, slot: int = 0) -> np.ndarray:
    return np.array([kind, run_id, n_tokens, n_items, flags, slot], dtype=np.int64)


def decode_header(tx: DecodeTx, skipped: bool = False, meta_len: int = 0) -> np.ndarray:
    """The begin message of a run's decode (`skipped`: cancelled before this rank computed
    it, no activations follow)."""
    flags = (DecodeFlag.SPECULATIVE if tx.speculative else DecodeFlag.NONE) | \
            (DecodeFlag.SKIPPED if skipped else DecodeFlag.NONE) | \
            (DecodeFlag.STATES if tx.states else DecodeFlag.NONE)
    return make_header(TxType.DECODE, tx.run_id, tx.n_tokens, meta_len, int(flags), tx.slot)


def encode_meta(tx: DecodeTx) -> np.ndarray:
    """A run's decode as int32: positions, per-token seq counts, output flags, then all seq
    ids."""
    n = tx.n_tokens
    flat = [s for seqs in tx.seq_ids for s in seqs]
    meta = np.empty(3 * n + len(flat), dtype=np.int32)
    meta[:n] = tx.positions
    meta[n:2 * n] = [len(s) for s in tx.seq_ids]
    meta[2 * n:3 * n] = tx.logit_rows
    meta[3 * n:] = flat
    return meta


def decode_tx(header: np.ndarray, meta: np.ndarray) -> DecodeTx:
    """The run's decode from its begin message and its meta (encode_meta's)."""
    run_id, n = int(header[1]), int(header[2])
    counts = meta[n:2 * n]
    seq_ids, at = [], 3 * n
    for c in counts:
        seq_ids.append(tuple(int(s) for s in meta[at:at + c]))
        at += int(c)
    return DecodeTx(run_id, tuple(int(p) for p in meta[:n]), tuple(seq_ids),
                    tuple(bool(x) for x in meta[2 * n:3 * n]),
                    bool(int(header[4]) & DecodeFlag.SPECULATIVE), int(header[5]),
                    bool(int(header[4]) & DecodeFlag.STATES))


def encode_kv_ops(ops: Sequence[KvOp]) -> np.ndarray:
    return np.array([[op.kind, op.seq, op.dst, op.p0, op.p1, op.slot] for op in ops],
                    dtype=np.int32).reshape(-1)


def decode_kv_ops(buf: np.ndarray) -> list[KvOp]:
    return [KvOp(KvOpType(int(r[0])), int(r[1]), int(r[2]), int(r[3]), int(r[4]), int(r[5]))
            for r in buf.reshape(-1, 6)]


assert HEADER_LEN == len(make_header(TxType.SHUTDOWN))
