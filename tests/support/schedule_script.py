"""The scheduler core driven by a script, for the tests that run it without MPI or llama.cpp:
a scripted greedy target (the token after position p is TARGET[p]), a scheduler built on it
(`make`), the result a greedy pipeline returns for a run (`result_for`), and `Script`, which
feeds events and keeps the runs in flight and the cutoff over time."""

from __future__ import annotations

import numpy as np

from pipeinfer.schedule import actions as A
from pipeinfer.schedule.events import ResultArrived, Start
from pipeinfer.schedule.generation import Generation, Request
from pipeinfer.schedule.options import Limits, SpecOptions
from pipeinfer.schedule.partition_pool import PartitionPool
from pipeinfer.schedule.pipeinfer import PipeInfer
from pipeinfer.schedule.transaction import RunResult

PROMPT = (5, 6, 7, 8)
TARGET = list(PROMPT) + [10 + i for i in range(200)]  # the target's greedy continuation


def make(cls=PipeInfer, n_predict=40, n_stages=3, **opts):
    opts.setdefault("p_recovery", 0.05)
    # the guard off: it times tokens, and a scripted drive's clock says nothing
    spec = SpecOptions(**{"guard": False, **opts})
    gen = Generation(Request(PROMPT, n_predict, 512), lambda t: False)
    pool = PartitionPool(spec.partitions, spec.n_parallel)
    return cls(gen, None, Limits(64, 512, 2048, n_stages), spec, pool)


def result_for(start: A.StartRun, target=TARGET) -> ResultArrived:
    """What a greedy pipeline returns for a run: per output row, the target's token after
    that row's position (whatever the row's token was: the core checks the path)."""
    rows = [target[p + 1] for p, out in zip(start.tx.positions, start.tx.logit_rows) if out]
    return ResultArrived(start.run_id, RunResult(start.run_id, None, np.array(rows)))


def of(actions, kind):
    return [a for a in actions if isinstance(a, kind)]


class Script:
    """Feeds events, remembers runs in flight (oldest first) and the cutoff over time."""

    def __init__(self, sched):
        self.sched, self.flight, self.cutoffs, self.log = sched, [], [], []

    def step(self, event):
        actions = self.sched.step(event)
        self.log.append((event, actions))
        self.flight += of(actions, A.StartRun)
        self.cutoffs += [a.value for a in of(actions, A.PolicyChanged) if a.name == "cutoff"]
        return actions

    def finish_oldest(self):
        return self.step(result_for(self.flight.pop(0)))

    def prefill(self):
        self.step(Start())
        return self.finish_oldest()
