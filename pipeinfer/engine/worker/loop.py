"""A worker rank: receives the head's transactions in order, has its StageCore apply them
(engine/worker/core.py: compute, skip or abort a run, KV operations, statistics, spans) and
forwards them; this module is only the MPI side of it. Between transactions it takes the
copies of KV cells its neighbours send it (replicas.py).

Cancellations arrive from the head on a side thread (independent of the begin stream) and go
to the core, which may abort the decode the main thread is in.

The runs of refill contexts (a refill along a generation: engine/head/refill.py) are computed
behind the main loop, by a thread of their own at the lowest priority
(background.py), and forwarded when done; KV operations on those contexts wait for them.

With wake-ups from both the previous rank and the head (transport/wakeup.py), the watcher
waits for cancellations all the time, each thread sleeps until a message for it is sent, and
an idle worker costs next to no CPU (while a decode runs the watcher also looks every
WATCH_WOKEN_S); without them the main loop polls for cancellations while idle and the watcher
only while a decode runs.

Spans are in the worker's own time.monotonic() clock; they go to the head with the statistics
at shutdown, where the trace converts them with this rank's clock offset (transport/clock_sync.py).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..transport import wakeup
from ..transport.backoff import Backoff, IdleBackoff
from ..transport.backoff import idle_backoff as backoff_for
from .background import Background, on_refill_context
from .core import ABORTED, COMPUTED, SKIPPED, StageCore
from ...report.metrics import peak_rss_mb, rss_mb
from ..transport.mpi import CANCEL_END
from ..transport.worker_link import WorkerLink
from ...model.kept_cells import KeptCells
from .replicas import END as REPLICAS_END, Replicas
from ...model.stage import Stage
from ..transport.wire import DecodeFlag, Tag, TxType, decode_header, decode_kv_ops, decode_tx
from ..transport.wakeup import Channel

# The cancel watcher polls (fast) only while a decode it may have to abort is running.
WATCH_FAST_S = 500e-6
# ... and with wake-ups, still looks at least this often while a decode runs: a wake-up can
# come before MPI has the message there to find (the busiest rank's watcher then slept its
# idle back-off, up to 0.1 s, while the decodes of runs cancelled meanwhile went on: 150-390 ms
# late on the last stage in traces), and a look costs a probe.
WATCH_WOKEN_S = 2e-3
RSS_EVERY = 64  # record the resident size every this many computed decodes
# What a rank appends to a busy probe (transport/wire.py Tag.BUSY), in this order: the
# seconds its stage computed, its CPU seconds (every thread's), its resident MB
PROBE_FIELDS = ("busy_s", "cpu_s", "rss_mb")


class Worker:
    def __init__(self, link: WorkerLink, stage: Stage, argmax_only: bool = False,
                 kept: KeptCells | Replicas | None = None):
        self.link = link
        self.argmax_only = argmax_only  # greedy sampling: return argmaxes, not logits
        self.is_last = link.next is None
        self._stop = threading.Event()
        self._computing = _Computing()  # wakes the cancel watcher when a decode starts
        self.core = StageCore(stage, computing=self._computing, kept=kept)
        # the refill contexts' runs: behind the main loop (None: the stage has no such)
        refills = stage is not None and stage.has_refill_contexts
        self._n_slots = stage.n_slots if refills else 0
        self.behind = Background(f"rank {link.rank} refills") if refills else None
        self.behind_core = StageCore(stage) if refills else None
        self._cores = [self.core] + ([self.behind_core] if refills else [])
        self.replicas = kept if isinstance(kept, Replicas) else None
        self._replicas_from = list(self.replicas.senders) if self.replicas else []
        if self.replicas is not None:
            self.replicas.send = lambda rank, copy: link.isend_obj(copy, rank, Tag.REPLICA)
        self._cancel_lock = threading.Lock()  # one thread at a time receives cancellations
        self._cancels_ended = False           # CANCEL_END received
        self._rss_trace_mb: list[float] = []
        self.woken = woken_by(link.prev, link.cancel_source)

    def _backoff(self, channel: Channel) -> IdleBackoff:
        return idle_backoff(self.link, channel, self.woken)

    # --- main loop --------------------------------------------------------------------------
    def run(self) -> dict:
        watcher = threading.Thread(target=self._watch_cancels, name="cancel-watcher", daemon=True)
        watcher.start()
        started, cpu0 = time.monotonic(), time.process_time()
        handlers = {TxType.DECODE: self._decode, TxType.KV: self._kv, TxType.BUSY: self._busy}
        backoff = self._backoff(Channel.MAIN)
        try:
            while True:
                if self.behind is not None:
                    self.behind.check()
                header = self.link.poll_begin()
                if header is None:
                    if not self.woken:  # else the watcher waits for them
                        self._poll_cancels()
                    if not self._take_replicas():
                        backoff.wait()
                    continue
                backoff.reset()
                kind = TxType(int(header[0]))
                if kind == TxType.SHUTDOWN:
                    self._end_behind()
                    if not self.is_last:
                        self.link.forward(header)
                    self._end_replicas()
                    if self.core.kept is not None:   # (an orderly end: nothing resumes)
                        self.core.kept.clear()
                        self.core.kept.flush()
                    break
                handler = handlers.get(kind)
                if handler is None:
                    raise RuntimeError(f"unexpected transaction type {kind.name}")
                handler(header)
        finally:
            if self.behind is not None:
                self.behind.close()
            self._stop.set()
            self._computing.set()
            wakeup.wake_self(Channel.CANCEL)
            watcher.join()
        backoff = self._backoff(Channel.CANCEL)
        while not self._cancels_ended:  # cancellations still on their way: take them
            if not self._poll_cancels():
                backoff.wait()
        stats = {"rank": self.link.rank, **self._core_stats(),
                 "rss_trace_mb": self._rss_trace_mb, "wall_s": time.monotonic() - started,
                 "cpu_s": time.process_time() - cpu0,  # every thread's, computing or not
                 "peak_rss_mb": peak_rss_mb()}
        self.link.send_stats(stats)
        self.link.flush()
        return stats

    def _decode(self, header: np.ndarray) -> None:
        meta = self.link.recv_payload(Tag.DECODE_META, np.int32)
        tx = decode_tx(header, meta)
        x = None
        if not int(header[4]) & DecodeFlag.SKIPPED:
            x = self.link.recv_payload(Tag.ACTIVATIONS, np.float32).reshape(tx.n_tokens, -1)
        if self.behind is not None and tx.slot >= self._n_slots:
            self.behind.submit(lambda: self._apply(self.behind_core, header, meta, tx, x))
        else:
            self._apply(self.core, header, meta, tx, x)

    def _apply(self, core: StageCore, header: np.ndarray, meta: np.ndarray, tx,
               x: np.ndarray | None) -> None:
        """Compute (or skip) a run on `core` and send what came of it on."""
        out, outcome = core.decode(tx, x)
        if outcome == COMPUTED and core.stats[COMPUTED] % RSS_EVERY == 0:
            self._rss_trace_mb.append(round(rss_mb(), 1))
        if self.is_last:
            self.link.send_result(tx.run_id, out, self.argmax_only, states=tx.states)
        elif out is None:
            self.link.forward(decode_header(tx, skipped=True, meta_len=len(meta)),
                              (meta, Tag.DECODE_META))
        else:
            self.link.forward(header, (meta, Tag.DECODE_META), (out.reshape(-1), Tag.ACTIVATIONS))

    def _kv(self, header: np.ndarray) -> None:
        buf = self.link.recv_payload(Tag.KV_OPS, np.int32)
        ops = decode_kv_ops(buf)
        if self.behind is not None and on_refill_context(ops, self._n_slots):
            self.behind.wait()
        self.core.kv(ops)
        if not self.is_last:
            self.link.forward(header, (buf, Tag.KV_OPS))
        self._take_replicas()

    def _end_behind(self) -> None:
        """At shutdown: the background's runs done (and sent on)."""
        if self.behind is not None:
            self.behind.wait()

    def _core_stats(self) -> dict:
        """The statistics and spans of the main loop's runs and the background's together."""
        stats = dict(self.core.stats, spans=list(self.core.spans))
        for core in self._cores[1:]:
            for key in (COMPUTED, SKIPPED, ABORTED, "busy_s"):
                stats[key] += core.stats[key]
            stats["spans"] = sorted(stats["spans"] + list(core.spans), key=lambda span: span[1])
        return stats

    # --- copies of cells to and from the neighbours (replicas.py) ------------------------
    def _take_replicas(self) -> bool:
        """Keep the copies of cells neighbours have sent; whether there were any."""
        took = False
        for sender in list(self._replicas_from):
            while (got := self.link.poll_obj(sender, Tag.REPLICA)) is not None:
                took = True
                if not self.replicas.receive(got[1]):
                    self._replicas_from.remove(sender)
                    break
        return took

    def _end_replicas(self) -> None:
        """Send each neighbour the end mark, and take copies until every sender's has come."""
        if self.replicas is None:
            return
        for rank in sorted({part[0] for part in self.replicas.parts}):
            self.link.isend_obj(REPLICAS_END, rank, Tag.REPLICA)
        backoff = self._backoff(Channel.MAIN)
        while self._replicas_from:
            if not self._take_replicas():
                backoff.wait()

    def _busy(self, header: np.ndarray) -> None:
        """A busy probe: this rank's PROBE_FIELDS appended (its busy and CPU seconds so far,
        its resident MB now), on to the next rank or the head."""
        mine = (sum(core.stats["busy_s"] for core in self._cores), time.process_time(),
                rss_mb())
        busy = np.append(self.link.recv_payload(Tag.BUSY, np.float64), mine)
        if self.is_last:
            self.link.send_busy(busy)
        else:
            self.link.forward(header, (busy, Tag.BUSY))

    # --- cancellations ----------------------------------------------------------------------
    def _watch_cancels(self) -> None:
        """Side thread: receives cancellations while a decode runs (it may have to abort it:
        looks every WATCH_FAST_S, with wake-ups at least every WATCH_WOKEN_S); with wake-ups
        also while idle (it sleeps until one is sent). Without them the main loop polls for
        them while nothing is computed, so an idle worker has one polling thread, not two."""
        idle = self._backoff(Channel.CANCEL) if self.woken else None
        fast = Backoff(limit=WATCH_FAST_S if idle is None else WATCH_WOKEN_S,
                       channel=Channel.CANCEL, sleep=lambda s: self.link.sleep(s, Channel.CANCEL))
        while not self._stop.is_set():
            if idle is None and not self._computing.is_set():
                self._computing.wait()
                fast.reset()
                continue
            backoff = fast if self._computing.is_set() else idle
            if self._poll_cancels():
                fast.reset()
                if idle is not None:
                    idle.reset()
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
            if len(ids) == 1 and int(ids[0]) == CANCEL_END:
                self._cancels_ended = True
                return True
            for core in self._cores:
                core.cancel(ids)
            return True
        finally:
            self._cancel_lock.release()


class _Computing(threading.Event):
    """Set while a decode runs; setting it also wakes the cancel watcher from an idle sleep,
    so that it looks every WATCH_WOKEN_S from the decode's start on."""

    def set(self) -> None:
        super().set()
        wakeup.wake_self(Channel.CANCEL)


class Idle:
    """A rank without layers (the auto split left it out of the chain): it waits, politely,
    for the head's SHUTDOWN and reports its (empty) statistics."""

    def __init__(self, link: WorkerLink):
        self.link = link  # its `prev` is the head

    def run(self) -> dict:
        started = time.monotonic()
        backoff = idle_backoff(self.link, Channel.MAIN, woken_by(self.link.prev))
        while True:
            header = self.link.poll_begin()
            if header is not None and TxType(int(header[0])) == TxType.SHUTDOWN:
                break
            if header is not None:
                raise RuntimeError(f"rank {self.link.rank} holds no layers but got a "
                                   f"{TxType(int(header[0])).name} transaction")
            backoff.wait()
        stats = {"rank": self.link.rank, "busy_s": 0.0, "idle": True,
                 "wall_s": time.monotonic() - started, "peak_rss_mb": peak_rss_mb()}
        self.link.send_stats(stats)
        self.link.flush()
        return stats


def woken_by(*ranks: int) -> bool:
    """Whether every one of `ranks` wakes this rank when it sends to it."""
    return wakeup.woken_by(ranks)


def idle_backoff(link: WorkerLink, channel: Channel, woken: bool) -> IdleBackoff:
    """A worker's idle wait on `channel`: its sleeps keep the link's sends moving
    (backoff.idle_backoff)."""
    return backoff_for(woken, channel, lambda seconds: link.sleep(seconds, channel))
