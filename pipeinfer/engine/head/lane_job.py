"""What a lane's work that is not a generation (an embedding request, a refill) shows of
itself where lanes.py and the serve loop read a generation's driver, its scheduler and its
generation: it is all three."""

from __future__ import annotations

from ...schedule.counters import Counters


class LaneJob:
    """A lane's runs without a scheduler: `begin` sends them, `feed` takes their events."""

    drafts = None
    prefilled = True     # (nothing to rebuild: PipelineShare.rebuilding)
    resumed = ()
    rooted_runs = 0

    def __init__(self) -> None:
        self.finished = self.cancelled = False
        self.counters = Counters()   # no speculation: all zero (the console's pulse adds them up)

    @property
    def sched(self) -> "LaneJob":
        return self

    @property
    def gen(self) -> "LaneJob":
        return self

    @property
    def request(self) -> "LaneJob":
        return self

    def turn_drafts(self) -> bool:
        return False
