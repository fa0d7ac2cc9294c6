"""A worker rank: applies the head's transactions to its stage, in order, and forwards them.

Cancellations arrive on a side thread (they travel backwards, independent of the begin
stream); a run named by one is skipped if not started, or aborted at the next graph node
through llama.cpp's abort callback if it is being computed.

Every decode leaves a span (run id, start, end, outcome, tokens, speculative) in the worker's
own time.monotonic() clock; they go to the head with the statistics at shutdown, where the
trace converts them with this rank's clock offset (Link.clock_offsets).
"""

from __future__ import annotations

import resource
import threading
import time
from collections import deque

import numpy as np

from .backoff import Backoff, IdleBackoff
from .metrics import rss_mb
from .mpi_transport import CANCEL_END, WorkerLink
from .stage import Stage, StageAborted
from .transaction import DecodeFlag, DecodeTx, Tag, TxType, decode_kv_ops
from .transport import apply_kv, record_span

# The cancel watcher polls (fast) only while a decode it may have to abort is running.
WATCH_FAST_S = 500e-6


RSS_EVERY = 64  # record the resident size every this many computed decodes
# Spans kept for the trace (the newest ones): bounds a long-lived worker's memory (~200 bytes
# a span) while any single run of the program fits with room to spare.
SPANS_MAX = 100_000


class Worker:
    def __init__(self, link: WorkerLink, stage: Stage, argmax_only: bool = False):
        self.link, self.stage = link, stage
        self.argmax_only = argmax_only  # greedy sampling: return argmaxes, not logits
        self.is_last = link.next is None
        self._cancelled: set[int] = set()
        self._done_through = -1          # highest run id already processed here
        self._active = -1                # run id being decoded now
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._computing = threading.Event()  # wakes the cancel watcher when a decode starts
        self._cancel_lock = threading.Lock()  # one thread at a time receives cancellations
        self._cancels_ended = False           # CANCEL_END received (and passed upstream)
        self.stats = {"rank": link.rank, "computed": 0, "skipped": 0, "aborted": 0,
                      "busy_s": 0.0, "kv_ops": 0, "rss_trace_mb": []}
        # [run_id, start, end, outcome, n_tokens, speculative], see record_span
        self.spans: deque[list] = deque(maxlen=SPANS_MAX)

    # --- main loop --------------------------------------------------------------------------
    def run(self) -> dict:
        watcher = threading.Thread(target=self._watch_cancels, name="cancel-watcher", daemon=True)
        watcher.start()
        started = time.monotonic()
        handlers = {TxType.DECODE: self._decode, TxType.KV: self._kv}
        backoff = IdleBackoff()
        try:
            while True:
                header = self.link.poll_begin()
                if header is None:
                    self._poll_cancels()
                    backoff.wait()
                    continue
                backoff.reset()
                kind = TxType(int(header[0]))
                if kind == TxType.SHUTDOWN:
                    if not self.is_last:
                        self.link.forward(header)
                    break
                handler = handlers.get(kind)
                if handler is None:
                    raise RuntimeError(f"unexpected transaction type {kind.name}")
                handler(header)
        finally:
            self._stop.set()
            self._computing.set()
            watcher.join()
        backoff = IdleBackoff()
        while not self._cancels_ended:  # cancellations still on their way: pass them on
            if not self._poll_cancels():
                backoff.wait()
        self.stats["wall_s"] = time.monotonic() - started
        self.stats["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.stats["spans"] = list(self.spans)
        self.link.send_stats(self.stats)
        self.link.flush()
        return self.stats

    def _decode(self, header: np.ndarray) -> None:
        meta = self.link.recv_payload(Tag.DECODE_META, np.int32)
        tx = DecodeTx.from_wire(header, meta)
        skipped = bool(int(header[4]) & DecodeFlag.SKIPPED)
        x = None
        if not skipped:
            x = self.link.recv_payload(Tag.ACTIVATIONS, np.float32).reshape(tx.n_tokens, -1)
        if x is None or self._take_cancel(tx.run_id):
            out = None
            self._skip(tx)
        else:
            out = self._compute(tx, x)
        if self.is_last:
            self.link.send_result(tx.run_id, out, self.argmax_only)
        elif out is None:
            self.link.forward(tx.header(skipped=True, meta_len=len(meta)), (meta, Tag.DECODE_META))
        else:
            self.link.forward(header, (meta, Tag.DECODE_META), (out.reshape(-1), Tag.ACTIVATIONS))

    def _compute(self, tx: DecodeTx, x: np.ndarray) -> np.ndarray | None:
        with self._lock:
            self._active = tx.run_id
            if tx.run_id in self._cancelled:  # cancelled since the check in _decode
                self.stage.cancel(tx.run_id)
        t0 = time.perf_counter()
        start = time.monotonic()
        self._computing.set()
        try:
            out = self.stage.decode(tx.positions, tx.seq_ids, embd=x, logit_rows=tx.logit_rows,
                                    run_id=tx.run_id)
            record_span(self.spans, tx, start, time.monotonic(), "computed")
            self.stats["computed"] += 1
            if self.stats["computed"] % RSS_EVERY == 0:
                self.stats["rss_trace_mb"].append(round(rss_mb(), 1))
            return out
        except StageAborted:
            record_span(self.spans, tx, start, time.monotonic(), "aborted")
            self.stats["aborted"] += 1
            return None
        finally:
            self._computing.clear()
            self.stats["busy_s"] += time.perf_counter() - t0
            with self._lock:
                self._active = -1
                self._done_through = max(self._done_through, tx.run_id)
                self._cancelled.discard(tx.run_id)

    def _take_cancel(self, run_id: int) -> bool:
        """True if `run_id` was cancelled before this rank started it."""
        with self._lock:
            return run_id in self._cancelled

    def _skip(self, tx: DecodeTx) -> None:
        now = time.monotonic()
        record_span(self.spans, tx, now, now, "skipped")
        self.stats["skipped"] += 1
        with self._lock:
            self._cancelled.discard(tx.run_id)
            self._done_through = max(self._done_through, tx.run_id)

    def _kv(self, header: np.ndarray) -> None:
        buf = self.link.recv_payload(Tag.KV_OPS, np.int32)
        apply_kv(self.stage, decode_kv_ops(buf))
        self.stats["kv_ops"] += len(buf) // 5
        if not self.is_last:
            self.link.forward(header, (buf, Tag.KV_OPS))

    # --- cancellations ----------------------------------------------------------------------
    def _watch_cancels(self) -> None:
        """Side thread: receives cancellations while a decode runs (it may have to abort it).
        While nothing is computed the main loop polls for them itself, so an idle worker has
        one polling thread, not two."""
        backoff = Backoff(limit=WATCH_FAST_S)
        while not self._stop.is_set():
            if not self._computing.is_set():
                self._computing.wait()
                backoff.reset()
                continue
            if self._poll_cancels():
                backoff.reset()
            else:
                backoff.wait()

    def _poll_cancels(self) -> bool:
        """Receive and apply one waiting cancellation message; False if there was none (or the
        other thread is receiving one)."""
        if not self._cancel_lock.acquire(blocking=False):
            return False
        try:
            ids = self.link.poll_cancel()
            if ids is None:
                return False
            self.link.cancel_upstream(ids)
            if len(ids) == 1 and int(ids[0]) == CANCEL_END:
                self._cancels_ended = True
                return True
            with self._lock:
                for run_id in (int(i) for i in ids):
                    if run_id == self._active:
                        self.stage.cancel(run_id)
                    elif run_id > self._done_through:
                        self._cancelled.add(run_id)
            return True
        finally:
            self._cancel_lock.release()
