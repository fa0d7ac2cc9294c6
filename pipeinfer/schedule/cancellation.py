"""Early inference cancellation (paper IV-D): which runs in flight became useless.

After tokens are accepted, a run is *superfluous* if every position it could decide is
already accepted, and *invalidated* if it assumed a token that was rejected. Both are marked
cancelled (their results will be dropped). A cancellation message goes out only for
speculative ones that no live run copied its context from: a run's KV entries must exist on
every stage before a run continuing it copies them.
"""

from __future__ import annotations

from typing import Sequence

from .runs import Run, RunState


def useless_runs(live: Sequence[Run], accepted: Sequence[int]) -> list[tuple[Run, RunState]]:
    """The live runs that can no longer decide a token, with why."""
    doomed = []
    for run in live:
        state = run.classify(accepted)
        if state != RunState.VALID:
            doomed.append((run, state))
    return doomed


def to_cancel(doomed: Sequence[Run], live: Sequence[Run], sources: dict[int, int]) -> list[int]:
    """Run ids worth a cancellation message: speculative, and no live run copies from them."""
    copied_from = {sources.get(r.run_id) for r in live if not r.cancelled}
    return [r.run_id for r in doomed if r.speculative and r.run_id not in copied_from]
