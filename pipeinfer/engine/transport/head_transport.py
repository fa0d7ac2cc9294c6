"""The head's side of the MPI pipeline: decodes, KV operations and cancellations out to the
workers, results and their errors back (the scheduler's Transport protocol over mpi.Link)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import wakeup
from .backoff import Backoff
from .mpi import CANCEL_END, Link
from .wire import (HEADER_LEN, ResultFlag, Tag, TxType, decode_header, encode_kv_ops,
                   encode_meta, make_header)
from ...schedule.transaction import DecodeTx, KvOp, RunResult

# How often the head's polls for a result also look for another rank's error report (a
# probe of every rank, the dearest part of a poll); rarer where the reports wake the head.
ERROR_CHECK_S, ERROR_CHECK_WOKEN_S = 0.01, 0.1


class HeadTransport(Link):
    """The head's side of the pipeline (implements the scheduler's Transport protocol)."""

    def __init__(self, n_vocab: int, comm: Any = None, n_ranks: int | None = None,
                 chain: list[int] | None = None):
        super().__init__(comm)
        self.n_vocab = n_vocab
        self.n_ranks = n_ranks or self.size  # the pipeline's ranks (draft ranks follow them)
        chain = chain or list(range(self.n_ranks))
        self.stages = chain[1:]              # the ranks activations pass through, in order
        self._next_error_check = 0.0
        self.idle = [r for r in range(1, self.n_ranks) if r not in chain]  # left out
        self.first, self.last = self.stages[0], self.stages[-1]

    def send_decode(self, tx: DecodeTx, activations: np.ndarray) -> None:
        meta = encode_meta(tx)
        self.send(self.first, (decode_header(tx, meta_len=len(meta)), Tag.BEGIN),
                  (meta, Tag.DECODE_META),
                  (activations.astype(np.float32, copy=False).reshape(-1), Tag.ACTIVATIONS))

    def send_kv(self, ops: list[KvOp]) -> None:
        self.send(self.first, (make_header(TxType.KV, n_items=len(ops)), Tag.BEGIN),
                  (encode_kv_ops(ops), Tag.KV_OPS))

    def send_cancel(self, run_ids: list[int]) -> None:
        """To every worker at once, not relayed from the last: a relay is a worker's side
        thread, and a message it posts while its rank computes may wait for that rank's next
        call into MPI (tens of ms under MPICH's shared memory), while the head calls in all
        the time. A worker that has not reached a run yet skips it when it comes."""
        ids = np.array(run_ids, dtype=np.int64)
        for rank in self.stages:
            self.isend(ids, rank, Tag.CANCEL)

    def send_busy_probe(self) -> None:
        """Ask every worker for its busy seconds so far (after what it was sent before), its
        CPU seconds and resident memory (worker/loop.py PROBE_FIELDS)."""
        self.send(self.first, (make_header(TxType.BUSY), Tag.BEGIN),
                  (np.zeros(0, dtype=np.float64), Tag.BUSY))

    def poll_busy(self) -> np.ndarray | None:
        """The answer to a busy probe, if it is back: PROBE_FIELDS per worker, rank 1
        first, one flat array."""
        return self.recv_array(self.last, Tag.BUSY, np.float64, wait=False)

    def result_waiting(self) -> bool:
        return self.probe(self.last, Tag.RESULT) is not None

    @property
    def woken(self) -> bool:
        """Whether every other rank of the job wakes the head when it sends to it (results,
        errors, draft ranks' messages), so that the head's waits may sleep long."""
        return wakeup.woken_by(range(1, self.size))

    def poll_result(self) -> RunResult | None:
        """The next result if it is there; when none is, other ranks' errors (RankFailed) at
        most every ERROR_CHECK_S (ERROR_CHECK_WOKEN_S where every rank wakes the head)."""
        header = self.recv_array(self.last, Tag.RESULT, np.int64, wait=False)
        if header is None:
            now = time.monotonic()
            if now >= self._next_error_check:
                self._next_error_check = now + (ERROR_CHECK_WOKEN_S if self.woken
                                                else ERROR_CHECK_S)
                self.check_errors()
            return None
        run_id, n_rows, flags = int(header[1]), int(header[2]), ResultFlag(int(header[4]))
        if flags & ResultFlag.SKIPPED:
            return RunResult(run_id, None)
        if flags & ResultFlag.ARGMAX:
            return RunResult(run_id, None,
                             header[HEADER_LEN:HEADER_LEN + n_rows].astype(np.int32))
        rows = self.recv_array(self.last, Tag.LOGITS, np.float32)
        if flags & ResultFlag.STATES:
            return RunResult(run_id, None, states=rows.reshape(n_rows, -1))
        return RunResult(run_id, rows.reshape(n_rows, self.n_vocab))

    def shutdown(self) -> list[dict]:
        """Stop every worker and collect their statistics (rank order)."""
        self.isend(make_header(TxType.SHUTDOWN), self.first, Tag.BEGIN)
        self.send_cancel([CANCEL_END])
        for rank in self.idle:
            self.isend(make_header(TxType.SHUTDOWN), rank, Tag.BEGIN)
        stats = []
        for rank in range(1, self.n_ranks):
            backoff = Backoff()
            while self.probe(rank, Tag.STATS) is None:
                self.check_errors()  # a worker that fails now sends no statistics
                backoff.wait()
            stats.append(self.comm.recv(source=rank, tag=int(Tag.STATS)))
        self.flush()
        return stats
