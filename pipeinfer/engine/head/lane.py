"""One lane of lanes.py: a request's generation (or a refill's or an embedding's runs) in a
slot of its own, with its view of the shared pipeline (SlotPipeline: its runs and KV
operations tagged with the slot) and of the other lanes (PipelineShare: how much it may
speculate)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...config.serving import OFF
from ...schedule.generation import Generation
from ...schedule.transaction import DecodeTx, KvOp
from .driver import Driver
from .pipeline import Pipeline
from .refill import REFILL


class SlotPipeline:
    """One lane's view of the shared Pipeline: decodes and KV operations in its slot."""

    def __init__(self, pipe: Pipeline, slot: int, owners: dict[int, "Lane"]):
        self.pipe, self.slot, self.owners = pipe, slot, owners
        self.stage, self.n_stages, self.row_costs = pipe.stage, pipe.n_stages, pipe.row_costs
        self.lane: Lane | None = None    # whose runs these are (set once it exists)

    def decode(self, tx: DecodeTx, tokens) -> None:
        self.owners[tx.run_id] = self.lane
        self.pipe.decode(replace(tx, slot=self.slot), tokens)

    def kv(self, ops: list[KvOp]) -> None:
        self.pipe.kv([replace(op, slot=self.slot) for op in ops])

    def cancel(self, run_ids: list[int]) -> None:
        self.pipe.cancel(run_ids)

    def result_waiting(self) -> bool:
        return self.pipe.result_waiting()


class PipelineShare:
    """What a lane's scheduler sees of the pipeline it shares (Scheduler.share)."""

    def __init__(self, lanes):
        self.lanes = lanes   # (lanes.Lanes: its active lanes, pipeline and draft models)

    def load(self) -> int:
        """Runs in flight, of every lane."""
        return self.lanes.pipe.in_flight

    def shared(self) -> bool:
        """Whether more than one generation is under way."""
        return sum(not lane.finished and lane.strategy != REFILL
                   for lane in self.lanes.active) > 1

    def rebuilding(self) -> bool:
        """Whether a resumed generation is still evaluating its prompt and the tokens it had
        sent (serve's front resumes them after a failure): the drafts wait, so that the head's
        CPU goes to the runs every resumed client waits for."""
        return any(lane.gen.request.resumed and not lane.driver.sched.prefilled
                   for lane in self.lanes.active)

    def draft_lag(self, sched) -> int:
        """Tokens of `sched`'s accepted context that its lane's draft model does not hold
        yet (0 without a draft model): a resumed request's whole context after its rebuild,
        or a long prompt still being read."""
        lane = next((ln for ln in self.lanes.active if ln.driver.sched is sched), None)
        drafter = None if lane is None else self.lanes.drafter_of(lane.slot)
        held = getattr(drafter, "n_held", None)
        return 0 if held is None else max(0, len(sched.gen.accepted) - held)

    def limit(self, max_runs: int) -> int:
        """Most runs in flight under which a lane may start a speculative run."""
        return min(max_runs, self.lanes.pipe.n_stages) if self.shared() else max_runs


@dataclass
class Lane:
    slot: int
    driver: Driver          # its pipe is the lane's SlotPipeline (or an EmbeddingJob)
    owner: Any              # the caller's object for this request (serve: its completion)
    strategy: str           # its scheduler's (Lanes.strategy_now when it started)
    cache: str = OFF        # its request's prompt cache mode (prompt_cache.py)
    along: Any = None       # its refill along the generation (refill.AlongRefill), if any

    @property
    def gen(self) -> Generation:
        return self.driver.gen

    @property
    def finished(self) -> bool:
        return self.driver.sched.finished

    @property
    def rooted_runs(self) -> int:
        """Its runs that carried its drafts behind its pending token while it shared the
        pipeline (schedule/adaptive.py)."""
        return getattr(self.driver.sched, "rooted_runs", 0)

    @property
    def drained(self) -> bool:
        return self.finished and self.driver.sched.in_flight == 0
