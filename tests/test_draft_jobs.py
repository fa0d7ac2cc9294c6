"""How a draft job ends (engine/drafting/executors.py) on a real draft model: a job stopped
while it catches up on a long context is interrupted (the scheduler drafts again), but a job
whose first guess falls under the cutoff failed, stopped or not (the scheduler does not try
the same attempt again at once), and a confident job stopped at once ships its first guess."""

from __future__ import annotations

import numpy as np
import pytest

from pipeinfer.engine.drafting import drafter as drafter_module
from pipeinfer.engine.drafting.drafter import WARM_STEP, Drafter, DraftParams
from pipeinfer.engine.drafting.executors import InlineDrafts, ThreadedDrafts
from pipeinfer.engine.drafting.ngram_drafts import NgramDrafts
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.schedule.actions import DraftJob
from pipeinfer.schedule.events import DraftInterrupted, DraftReady
from support.tiny_set import N_BATCH


@pytest.fixture
def drafter(tiny):
    stage = Stage(tiny.aligned, StageConfig(n_ctx=512, n_batch=N_BATCH, n_seq_max=1),
                  final=True, label="draft")
    try:
        drafter = Drafter(stage, N_BATCH)
        drafter.prepare(list(tiny.prompt))     # it holds the prompt
        yield drafter
    finally:
        stage.close()


def stopped_at_once(drafts, job: DraftJob):
    """The event of `job`, stopped as soon as it was submitted (the scheduler does that
    when a target stage idles)."""
    drafts.submit(job)
    drafts.stop(job.job_id)
    while (event := drafts.poll()) is None:
        pass
    return event


def job(context, cutoff: float, job_id: int = 0) -> DraftJob:
    return DraftJob(job_id, tuple(context), None, cutoff, budget=4)


@pytest.mark.parametrize("executor", ["inline", "thread"])
def test_a_first_guess_under_the_cutoff_fails_even_when_stopped(tiny, drafter, executor):
    drafts = (InlineDrafts(drafter, DraftParams(), lambda: False) if executor == "inline"
              else ThreadedDrafts(drafter, DraftParams()))
    try:
        event = stopped_at_once(drafts, job(tiny.prompt, cutoff=1.01))
    finally:
        drafts.close()
    assert event == DraftReady(0, ())


def test_a_confident_job_stopped_at_once_ships_its_first_guess(tiny, drafter):
    drafts = InlineDrafts(drafter, DraftParams(), lambda: False)
    event = stopped_at_once(drafts, job(tiny.prompt, cutoff=0.0))
    assert isinstance(event, DraftReady) and [len(b) for b in event.branches] == [1]


def test_a_job_stopped_while_catching_up_is_interrupted(tiny, drafter):
    drafts = InlineDrafts(drafter, DraftParams(), lambda: False)
    context = list(tiny.prompt) + list(tiny.reference[:WARM_STEP + 8])
    before = drafter.evaluated
    event = stopped_at_once(drafts, job(context, cutoff=0.0))
    assert event == DraftInterrupted(0, evaluated=drafter.evaluated - before)
    assert len(tiny.prompt) < drafter.n_held < len(context)   # what it read is kept
    assert event.evaluated > 0   # its work, for the guard


@pytest.mark.parametrize("executor", ["inline", "thread"])
def test_a_draft_stopped_at_every_job_still_catches_up(tiny, drafter, executor, monkeypatch):
    """Behind by more than a step (after the guard's pause), with every job stopped as it
    starts (the stages idle) and the target a token further at each: each job's step gains
    more than that token, so the draft catches up and drafts again; even where a step's time
    bound allows no token at all (a slow draft: here the bound is made zero)."""
    monkeypatch.setattr(drafter_module, "WARM_STEP_S", 0.0)
    drafts = (InlineDrafts(drafter, DraftParams(), lambda: False) if executor == "inline"
              else ThreadedDrafts(drafter, DraftParams()))
    accepted = len(tiny.prompt) + WARM_STEP + 8
    context = list(tiny.prompt) + list(tiny.reference)
    try:
        for job_id in range(16):
            event = stopped_at_once(drafts, job(context[:accepted], 0.0, job_id))
            if isinstance(event, DraftReady):
                break
            accepted += 1   # the target generated a token meanwhile
    finally:
        drafts.close()
    assert isinstance(event, DraftReady) and event.branches, (job_id, drafter.n_held)
    assert job_id < 8


def test_an_inline_draft_warms_up_on_idle_turns_until_it_holds_the_prompt(tiny):
    """While the target prefills, each idle turn of the driver gives the inline draft one
    warm-up step and is told a step was taken (so the driver comes back at once instead of
    sleeping until a message wakes it); once the draft holds the prompt, idle turns are idle."""
    stage = Stage(tiny.aligned, StageConfig(n_ctx=512, n_batch=N_BATCH, n_seq_max=1),
                  final=True, label="draft")
    try:
        drafter = Drafter(stage, N_BATCH)
        drafts = InlineDrafts(drafter, DraftParams(), lambda: False)
        prompt = list(tiny.prompt) + list(tiny.reference[:2 * WARM_STEP])
        assert drafts.idle() is False                      # nothing to warm up yet
        drafts.warm(prompt)
        steps = 0
        while drafts.idle():
            steps += 1
            assert steps <= len(prompt)
        assert steps > 1 and drafter.n_held == len(prompt)
        assert drafts.idle() is False and drafts.cpu_s > 0
    finally:
        stage.close()


def test_a_failed_attempt_says_how_many_tokens_it_evaluated(tiny, drafter):
    """The guard counts a failed attempt's catching up as draft work: the event says how many
    tokens the draft model evaluated for it."""
    drafts = InlineDrafts(drafter, DraftParams(), lambda: False)
    context = list(tiny.prompt) + list(tiny.reference[:5])
    drafts.submit(job(context, cutoff=1.01))
    assert drafts.poll() == DraftReady(0, (), evaluated=5)


@pytest.mark.parametrize("cutoff", [0.0, 0.3])
def test_a_scoring_job_counts_what_the_draft_would_have_guessed_right(tiny, drafter, cutoff):
    """The guard's question at a probe (schedule/guard.py): over the tokens a job catches up
    on, at how many positions the draft's likeliest next token reaches the cutoff, and how
    many of those are the token that came. Counted against the draft's own logits of the
    whole text, evaluated apart; the text is the target's answer, then tokens of the prompt
    (which the draft does not expect there)."""
    tail = list(tiny.reference[:8]) + list(tiny.prompt[:8])
    context = list(tiny.prompt) + tail
    stage = Stage(tiny.aligned, StageConfig(n_ctx=512, n_batch=len(context), n_seq_max=1),
                  final=True, label="reference")
    try:
        rows = stage.decode(list(range(len(context))), [(0,)] * len(context), tokens=context)
    finally:
        stage.close()
    confident = right = 0
    for pos in range(len(tiny.prompt), len(context) - 1):   # rows of the tokens caught up on
        row = rows[pos].astype(float)
        p = np.exp(row - row.max())
        p /= p.sum()
        if p.max() >= cutoff:
            confident += 1
            right += int(p.argmax()) == context[pos + 1]
    assert 0 < right < len(tail) - 1   # (the text tells right from wrong guesses)
    drafts = InlineDrafts(drafter, DraftParams(), lambda: False)
    drafts.submit(DraftJob(0, tuple(context), None, cutoff, budget=4, score=True))
    event = drafts.poll()
    assert event.agreement == (len(tail) - 1, confident, right)
    drafts.submit(DraftJob(1, tuple(context + [tail[0]]), None, cutoff, budget=4))
    assert drafts.poll().agreement is None    # (a job that did not ask)


def test_a_scoring_job_goes_to_the_draft_model_past_a_lookup(tiny, drafter):
    """A text that repeats itself: a lookup answers the job, unless the job scores the draft
    (then the model catches up and drafts, even where the job says the model waits)."""
    context = list(tiny.prompt) * 2
    drafts = NgramDrafts(1, 4, fallback=InlineDrafts(drafter, DraftParams(), lambda: False))
    drafts.submit(DraftJob(0, tuple(context), None, 0.0, budget=4, model=False))
    assert drafts.poll().origin == "ngram"
    drafts.submit(DraftJob(1, tuple(context), None, 0.0, budget=4, model=False, score=True))
    event = drafts.poll()
    assert event.origin == "model" and event.agreement[0] == len(tiny.prompt) - 1
