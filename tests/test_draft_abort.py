"""A stale draft job's step aborted (engine/drafting/drafter.py Drafter.running and abort;
executors.ThreadedDrafts.stop with stale=True): the job gives nothing, and the draft's cells
stay those of a draft that was never aborted, so what it drafts next is the same to the bit.
On a real draft model; the abort goes through llama.cpp's abort callback, as a worker's."""

from __future__ import annotations

import time

import pytest

from pipeinfer.engine.drafting.drafter import Drafter, DraftParams
from pipeinfer.engine.drafting.executors import ThreadedDrafts
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.schedule.actions import DraftJob
from pipeinfer.schedule.events import DraftInterrupted, DraftReady
from support.tiny_set import N_BATCH

TREE = DraftParams(max_tokens=4, p_split=0.0, n_parallel=2)   # forks at once: two branches


def new_drafter(tiny) -> Drafter:
    stage = Stage(tiny.aligned, StageConfig(n_ctx=512, n_batch=N_BATCH, n_seq_max=2),
                  final=True, label="draft")
    drafter = Drafter(stage, N_BATCH)
    drafter.prepare(list(tiny.prompt))
    return drafter


def abort_at(drafter: Drafter, run_id: int, step: int):
    """A `should_stop` that never stops but aborts the run before the tree's `step`-th
    evaluation (0: before anything, even catching up)."""
    asked = [0]

    def should_stop() -> bool:
        asked[0] += 1
        if asked[0] == step:
            drafter.abort(run_id)
        return False

    if step == 0:
        drafter.abort(run_id)
    return should_stop


@pytest.mark.parametrize("where", ["catching up", "in the tree", "deep in the tree"])
def test_an_aborted_draft_gives_nothing_and_drafts_on_as_if_never_aborted(tiny, where):
    context = list(tiny.prompt) + list(tiny.reference[:12])
    later = context + list(tiny.reference[12:14])
    aborted, untouched = new_drafter(tiny), new_drafter(tiny)
    try:
        if where != "catching up":   # the context held: the first decode is the tree's
            aborted.sync(context)
            untouched.sync(context)
        held = aborted.n_held
        with aborted.running() as run_id:
            stop = abort_at(aborted, run_id, 3 if where == "deep in the tree" else 0)
            assert aborted.draft(context, TREE, 0.0, should_stop=stop) == ([], [])
        assert aborted.interrupted
        assert aborted.n_held == held   # the aborted batch's tokens are not held,
        assert aborted.stage.seq_pos_max(0) == held - 1   # nor any branch's cells
        assert aborted.stage.seq_pos_max(1) == -1
        branches, probs = aborted.draft(later, TREE, 0.0)
        assert len(branches) == 2
        assert (branches, probs) == untouched.draft(later, TREE, 0.0)
    finally:
        aborted.stage.close()
        untouched.stage.close()


def test_a_draft_outside_a_run_is_not_aborted(tiny):
    """An abort names one run: the draft's other decodes (a later job's, the warm-up's) go on."""
    drafter = new_drafter(tiny)
    try:
        with drafter.running() as run_id:
            pass
        drafter.abort(run_id)
        context = list(tiny.prompt) + list(tiny.reference[:4])
        with drafter.running():
            branches, _ = drafter.draft(context, TREE, 0.0)
        assert branches and not drafter.interrupted
    finally:
        drafter.stage.close()


@pytest.mark.parametrize("stale", [False, True])
def test_a_stale_stop_ends_the_step_under_way_and_a_ship_stop_keeps_it(tiny, stale):
    """A job drafting many tokens, stopped while it runs: stopped to ship, it ends after its
    step with the tokens drafted so far; stopped as stale, its step is aborted and it gives
    nothing."""
    drafter = new_drafter(tiny)
    drafts = ThreadedDrafts(drafter, DraftParams(max_tokens=400))
    try:
        drafts.submit(DraftJob(0, tuple(tiny.prompt), None, 0.0, budget=400))
        deadline = time.monotonic() + 30
        while drafts._current.run_id is None and time.monotonic() < deadline:
            time.sleep(1e-4)
        drafts.stop(0, stale=stale)
        while (event := drafts.poll()) is None:
            time.sleep(1e-4)
    finally:
        drafts.close()
        drafter.stage.close()
    if stale:
        assert isinstance(event, DraftInterrupted)
    else:
        assert isinstance(event, DraftReady) and 0 < len(event.branches[0]) < 400
