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

A refill *along* the generation (AlongRefill, `serve --refill-along`) does the same work
earlier: while the answer is generated, each whole chunk of the conversation, once its
tokens are accepted, is evaluated in the slot's refill context (model/stage.py), which
first took the slot's exact cells (ctx_seed). Nothing else lies in that context, so each
chunk lands right after its prefix, as in a fresh evaluation: computed in the slot's own
context, behind the generation's decode cells, a 64-token batch gives other bits. When the
generation ended, the slot takes the refill context's cells back (Lanes.reap), and the next
turn, even asked at once, evaluates only what follows them. Every rank computes those runs
behind its others, at the lowest priority (worker/background.py): the answer's runs do not
wait for a chunk at each stage, and the refill takes the time they leave (what is left of
it when the answer ends, the next turn waits for).
"""

from __future__ import annotations

from ...schedule.events import Cancel, ResultArrived
from ...schedule.generation import CANONICAL_SEQ
from ...schedule.speculation import runs_of
from ...schedule.transaction import DecodeTx, ctx_seed, seq_rm
from .lane_job import LaneJob

REFILL = "refill"   # a refill lane's strategy name (Lane.strategy)
ALONG = "refill-along"   # an AlongRefill's (never among Lanes.active: its generation's)


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
            self._send(span)

    def _send(self, span: range) -> None:
        n = len(span)
        tx = DecodeTx(next(self._run_ids), tuple(span), ((CANONICAL_SEQ,),) * n, (False,) * n)
        self.pipe.decode(tx, self.tokens[span.start:span.stop])
        self._out.append(tx.run_id)

    def feed(self, event) -> None:
        if isinstance(event, Cancel):
            if not self.cancelled:
                self.cancelled = True
                self.pipe.cancel(list(self._out))
        elif isinstance(event, ResultArrived):
            self._out.remove(event.run_id)
            # a job's results come back in the order it issued its runs; the cells count
            # only while every chunk before came back computed (a cancelled run leaves holes
            # on some ranks)
            if event.result.cancelled:
                self._broken = True
            elif not self._broken:
                self.exact += self.chunk
        self.finished = self.cancelled or not self._out

    def kv_after(self) -> list:
        """The KV operations once every run is back: the cells of runs cancelled on their way
        (some ranks computed them, some not) removed."""
        return [] if self.exact >= self.stop else [seq_rm(CANONICAL_SEQ, self.exact, -1)]


class AlongRefill(RefillJob):
    """The refill of a generation under way: its accepted tokens' whole chunks from `start`
    (the slot's exact cells once its prompt went in) on, each sent once accepted, into the
    refill context `pipe` decodes in, which first takes context `source`'s cells below
    `start`; `limit`: that context's cells."""

    def __init__(self, pipe, source: int, start: int, limit: int, chunk: int, run_ids):
        super().__init__(pipe, (), start, start, chunk, run_ids)
        self.source, self.limit = source, limit

    def begin(self) -> None:
        """(Nothing to send before a whole chunk is accepted: offer.)"""

    def feed(self, event) -> None:
        super().feed(event)
        if self._broken:   # (its slot may have taken its cells back already: Lanes._release)
            raise RuntimeError("a run refilling a conversation along its generation came "
                               "back cancelled: its slot's cells would not be exact")

    def offer(self, gen) -> None:
        """Send the chunks generation `gen`'s accepted tokens now complete."""
        end = min(len(gen.request.prompt) + len(gen.tokens), self.limit)
        if self.cancelled or self._broken or self.stop + self.chunk > end:
            return
        if self.stop == self.start:
            self.pipe.kv([ctx_seed(CANONICAL_SEQ, self.source, self.start)])
        self.tokens = tuple(gen.accepted[:end // self.chunk * self.chunk])
        while self.stop + self.chunk <= end:
            self._send(range(self.stop, self.stop + self.chunk))
            self.stop += self.chunk
