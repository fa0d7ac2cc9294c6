"""A finished conversation's answer evaluated again as prompt, while its slot is idle.

Under the exact prompt cache (prompt_cache.py) a slot keeps, of its last request, only the
cells a fresh evaluation would compute alike: the whole prompt chunks. The answer's cells
came from decode runs, so the next turn of the conversation, whose prompt holds that answer,
evaluates it again. A refill does that work before the next turn comes: once a generation
ended, the whole chunks of its prompt and answer past the slot's exact cells are evaluated
in the chunks a fresh evaluation of any prompt starting with those tokens uses (bounds at
multiples of the chunk size, no output rows, sequence 0, the same cells before them), so
their cells are the same bits and the slot's exact prefix grows by them.

A refill is background work: it starts only when no generation is under way and no request
waits (Lanes.refill_idle). A request that continues the conversation (its prompt starts with
the refill's tokens and goes on) takes the slot at once and counts the refill's chunks as
kept: they are the chunks its own fresh evaluation would compute first, already on their
way, and its runs follow them through every stage (Lanes.start). Any other request cancels
every refill (the serve loop: Lanes.stop_refills): its slot keeps the chunks that came back
computed, in order, the rest of its cells (and tokens) are dropped, and the request
evaluates what it needs itself. It stands in a Lane where a generation's driver would
(lane_job.py).
"""

from __future__ import annotations

from ...schedule.events import Cancel, ResultArrived
from ...schedule.generation import CANONICAL_SEQ
from ...schedule.speculation import runs_of
from ...schedule.transaction import DecodeTx, seq_rm
from .lane_job import LaneJob

REFILL = "refill"   # a refill lane's strategy name (Lane.strategy)


class RefillJob(LaneJob):
    """The runs of one refill: `tokens`' positions `start` to `stop` (multiples of `chunk`)
    in sequence 0 of the lane's slot, whose cells from `start` on are dropped first."""

    def __init__(self, pipe, tokens, start: int, stop: int, chunk: int, run_ids):
        super().__init__()
        self.pipe, self.tokens, self.chunk = pipe, tuple(tokens), chunk
        self.start, self.stop, self._run_ids = start, stop, run_ids
        self.exact = start             # the cells computed, in order, from position 0
        self._out: list[int] = []      # run ids not back yet, in issue order
        self._broken = False           # a run came back cancelled: no later cell counts
        self.continued = False         # a request continuing its tokens took its slot

    @property
    def in_flight(self) -> int:
        return len(self._out)

    def begin(self) -> None:
        self.pipe.kv([seq_rm(CANONICAL_SEQ, self.start, -1)])
        for span in runs_of(range(self.start, self.stop), self.chunk):
            n = len(span)
            tx = DecodeTx(next(self._run_ids), tuple(span), ((CANONICAL_SEQ,),) * n,
                          (False,) * n)
            self.pipe.decode(tx, self.tokens[span.start:span.stop])
            self._out.append(tx.run_id)

    def feed(self, event) -> None:
        if isinstance(event, Cancel):
            if not self.cancelled:
                self.cancelled = True
                self.pipe.cancel(list(self._out))
        elif isinstance(event, ResultArrived):
            self._out.remove(event.run_id)
            # results come back in issue order; the cells count only while every chunk
            # before came back computed (a cancelled run leaves holes on some ranks)
            if event.result.cancelled:
                self._broken = True
            elif not self._broken:
                self.exact += self.chunk
        self.finished = self.cancelled or not self._out

    def kv_after(self) -> list:
        """The KV operations once every run is back: the cells of runs cancelled on their way
        (some ranks computed them, some not) removed."""
        return [] if self.exact >= self.stop else [seq_rm(CANONICAL_SEQ, self.exact, -1)]
