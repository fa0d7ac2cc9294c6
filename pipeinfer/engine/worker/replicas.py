"""A worker's kept KV cells (model/kept_cells.py) and the copies it sends its neighbours: each
time the head asks for a copy of a request's cells, the worker writes its own, and every
SEND_EVERY tokens sends, to each rank that would take over some of its layers if its host
were lost (model/handover.py), the cells of those layers; and it writes what its
neighbours send it.
A job started after the loss assembles the lost layers' cells from those copies
(job/restore.py).

Copies travel as pickled messages of their own tag (Tag.REPLICA), received by the worker's
main loop between transactions. When a worker leaves its loop it sends each rank it sends
copies to an end mark, and takes every copy sent to it until each of its senders' end mark
has come: no copy is left in flight to a rank that is gone, so no send waits at the end.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from ...model import kv_state
from ...model.kept_cells import Kept, KeptCells

END = None   # the last REPLICA message a rank sends each neighbour
# Accepted tokens between two copies sent to the neighbours (its own copy is written every
# engine/head/kept.py SAVE_EVERY). A copy is the whole context's cells of those layers and
# travels on the link the activations take, delaying them while it passes; a request
# resumed after a lost host evaluates again what followed the last one: more often costs
# every run, less often costs the recovery (both measured by experiments/bench_failover.py,
# --cost and --scenario host; the figures are on the results pages).
SEND_EVERY = 16
ENDED_KEPT = 4096   # ended requests remembered (far more than are ever under way at once)


class Replicas:
    """Where KV_SEQ_SAVE and KV_SEQ_DROP go on a worker (core.apply_kv): `own` its copies,
    `held` those its neighbours send; `parts` (rank, first, last, identity): the layers
    whose cells go to which rank; `senders`: the ranks that send this one theirs."""

    def __init__(self, own: KeptCells, held: KeptCells | None, parts, senders: list[int]):
        self.own, self.held = own, held
        self.parts, self.senders = list(parts), list(senders)
        self.send: Callable[[int, object], None] | None = None   # (rank, message)
        # requests that ended here: a copy the last rank sends its predecessor may come
        # after the predecessor took the end of its request (it runs ahead)
        self._ended: deque[int] = deque(maxlen=ENDED_KEPT)
        self._sent: dict[int, int] = {}   # request -> positions its last copy sent held

    def save_stage(self, stage, slot: int, seq: int, key: int, n: int, digest: int) -> None:
        body = stage.seq_state(seq, slot=slot)
        self.own.save(key, n, digest, body)
        if not self.parts or self.send is None:
            return
        if key in self._sent and n - self._sent[key] < SEND_EVERY:
            return   # (a request's first copy goes at once: its neighbours hold one early)
        self._sent[key] = n
        state = kv_state.parse(body)
        if state is None:
            return   # (a layout this module does not know: a failure rebuilds the cells)
        first = self.own.layers[0]
        for rank, lo, hi, identity in self.parts:
            blob = state.sliced(lo - first, hi - first).to_bytes()
            self.send(rank, Kept(key, n, digest, 0, (), blob, identity, (lo, hi)))

    def drop(self, key: int) -> None:
        """The request ended: every copy of it here goes (those of the stages it had before
        a failure changed the split too)."""
        self._ended.append(key)
        self._sent.pop(key, None)
        self.own.drop_all(key)
        if self.held is not None:
            self.held.drop_all(key)

    def clear(self) -> None:
        """The job ends in order: nothing is resumed (copies of earlier stages go too)."""
        for store in (self.own, self.held):
            if store is not None:
                store.drop_every()

    def flush(self) -> None:
        """Wait until every copy asked for is written or removed (they share a writer)."""
        for store in (self.own, self.held):
            if store is not None:
                store.flush()

    def receive(self, message) -> bool:
        """Keep a copy a neighbour sent; False for its end mark."""
        if message is END:
            return False
        if self.held is not None and message.key not in self._ended:
            self.held.write(message)
        return True
