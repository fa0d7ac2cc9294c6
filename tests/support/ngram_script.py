"""The scheduler core driven with n-gram drafts, without MPI or llama.cpp: a target that
repeats its prompt's pattern (TARGET) or copies it with an edit every 19 tokens (EDITED), a
scheduler on it (`make`), and `drive`, a pipeline of a given depth that answers its runs
with the target's tokens (test_ngram.py, test_guard.py, test_ramp.py)."""

from __future__ import annotations

from pipeinfer.schedule import actions as A
from pipeinfer.schedule.events import Start, Tick
from pipeinfer.schedule.generation import Generation, Request
from pipeinfer.schedule.options import Limits, SpecOptions
from pipeinfer.schedule.partition_pool import PartitionPool
from support.schedule_script import result_for

PATTERN = [31, 32, 33, 34, 35, 36]
PROMPT = tuple([5, 6] + PATTERN * 2)
# the target repeats the prompt's pattern, then says something new, then repeats again
TARGET = list(PROMPT) + PATTERN * 3 + list(range(60, 75)) + PATTERN * 10
# text that copies the prompt's pattern, with one token changed every 19 (an edit)
EDITED = list(PROMPT) + (PATTERN * 3 + [90]) * 8


def make(cls, source="ngram", n_predict=60, **opts):
    # the guard off: it times tokens, and a scripted drive's clock says nothing
    spec = SpecOptions(draft_thread=False, draft_source=source, **{"guard": False, **opts})
    gen = Generation(Request(PROMPT, n_predict, 512), lambda t: False)
    pool = PartitionPool(spec.partitions, spec.n_parallel)
    return cls(gen, None, Limits(64, 512, 2048, 3), spec, pool)


def drive(sched, drafts, depth=3, target=TARGET) -> list:
    """The generation of `target` to its end, with a pipeline `depth` runs deep: a result
    comes back when that many runs are in flight, or when the head found nothing to do.
    Every action is returned, in order."""
    flight, log = [], []

    def feed(event) -> bool:
        actions = sched.step(event)
        log.extend(actions)
        for a in actions:
            if isinstance(a, A.StartRun):
                flight.append(a)
            elif isinstance(a, A.StartDraft):
                drafts.submit(a.job)
            elif isinstance(a, A.StopDraft):
                drafts.stop(a.job_id)
            elif isinstance(a, A.WarmDraft):
                drafts.warm(a.tokens)
        return bool(actions)

    feed(Start())
    while True:
        event = drafts.poll()
        if event is not None:
            feed(event)
        elif not flight:
            return log
        elif sched.finished or len(flight) >= depth or not feed(Tick()):
            feed(result_for(flight.pop(0), target))
