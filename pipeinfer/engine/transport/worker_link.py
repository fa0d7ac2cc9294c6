"""A worker's side of the MPI pipeline: a transaction's begin and payload from the previous
rank, forwarded to the next, results and cancellations to and from the head."""

from __future__ import annotations

from typing import Any

import numpy as np

from .mpi import Link
from .wire import HEAD, ResultFlag, Tag, TxType, make_header


class WorkerLink(Link):
    """A worker's side: begin/payload from the previous rank, forward to the next, results and
    cancellations to and from the head."""

    def __init__(self, comm: Any = None, n_ranks: int | None = None,
                 chain: list[int] | None = None):
        super().__init__(comm)
        n_ranks = n_ranks or self.size  # the pipeline's ranks (draft ranks follow them)
        chain = chain or list(range(n_ranks))  # the ranks activations pass through
        i = chain.index(self.rank)
        self.prev = chain[i - 1]
        self.next = chain[i + 1] if i + 1 < len(chain) else None
        self.cancel_source = HEAD

    def poll_begin(self) -> np.ndarray | None:
        return self.recv_array(self.prev, Tag.BEGIN, np.int64, wait=False)

    def recv_payload(self, tag: Tag, dtype) -> np.ndarray:
        return self.recv_array(self.prev, tag, dtype)

    def forward(self, header: np.ndarray, *payload: tuple[np.ndarray, Tag]) -> None:
        self.send(self.next, (header, Tag.BEGIN), *payload)

    def send_result(self, run_id: int, logits: np.ndarray | None, argmax_only: bool,
                    states: bool = False) -> None:
        """Send a run's logits to the head (only each row's argmax if `argmax_only`: in the
        header's message, one message for the head to take, not two), or its hidden states
        (`states`: an embedding's run)."""
        n_rows = 0 if logits is None else logits.shape[0]
        payload, argmax = None, None
        if logits is None:
            flags = ResultFlag.SKIPPED
        elif states:
            flags, payload = ResultFlag.STATES, logits.reshape(-1)
        elif argmax_only:
            flags, argmax = ResultFlag.ARGMAX, np.argmax(logits, axis=1)
        else:
            flags, payload = ResultFlag.NONE, logits.reshape(-1)
        header = make_header(TxType.LOGITS, run_id, n_rows, flags=int(flags))
        if argmax is not None:
            header = np.concatenate([header, argmax.astype(np.int64)])
        messages = [(header, Tag.RESULT)]
        if payload is not None:
            messages.append((payload, Tag.LOGITS))
        self.send(HEAD, *messages)

    def poll_cancel(self) -> np.ndarray | None:
        return self.recv_array(self.cancel_source, Tag.CANCEL, np.int64, wait=False)

    def send_stats(self, stats: dict) -> None:
        self.isend_obj(stats, HEAD, Tag.STATS)

    def send_busy(self, busy: np.ndarray) -> None:
        """The last rank: a busy probe's answer to the head."""
        self.isend(busy, HEAD, Tag.BUSY)
