"""pipeinfer's ramp for n-gram runs (schedule/ramp.py): after a break (the pending token
needed a run of its own) the next n-gram runs are 1, 2, then full size; the lookup answers
with the job's n-gram budget while the model keeps the whole budget; through the scheduler
core on scripted results the output stays the target's."""

from __future__ import annotations

import pytest

from pipeinfer.engine.drafting.ngram_drafts import NgramDrafts
from pipeinfer.schedule import actions as A
from pipeinfer.schedule.actions import DraftJob
from pipeinfer.schedule.events import DraftReady
from pipeinfer.schedule.pipeinfer import PipeInfer
from pipeinfer.schedule.ramp import Ramp
from support.ngram_script import EDITED, PROMPT, drive, make
from support.scripted_executor import ScriptedModel


def test_ramp_grows_per_run_started_and_starts_short_after_a_break():
    ramp = Ramp(top=3)
    sizes = []
    for _ in range(5):
        sizes.append(ramp.size)
        ramp.started()
    assert sizes == [1, 2, 3, 3, 3]
    assert ramp.broke() is True and ramp.size == 1
    assert ramp.broke() is False          # already short: nothing changed
    ramp.started()
    assert ramp.size == 2


def test_ramp_checks_its_sizes():
    with pytest.raises(ValueError):
        Ramp(top=2, first=3)
    with pytest.raises(ValueError):
        Ramp(top=3, first=0)


def test_lookup_answers_with_the_ngram_budget_and_the_model_with_the_whole_one():
    model = ScriptedModel(target=[1, 2, 3, 4, 5, 6, 7])
    drafts = NgramDrafts(2, 4, fallback=model)
    hit = DraftJob(0, (1, 2, 3, 1, 2), None, 0.3, 3, ngram_budget=1)
    miss = DraftJob(1, (1, 2, 3, 4), None, 0.3, 3, ngram_budget=1)
    assert hit.lookup_budget == 1 and "1 n-gram" in repr(hit)
    assert DraftJob(2, (), None, 0.3, 2, ngram_budget=5).lookup_budget == 2
    drafts.submit(hit)
    drafts.submit(miss)
    assert drafts.poll() == DraftReady(0, ((3,),), origin="ngram")
    assert drafts.poll() == DraftReady(1, ((5, 6, 7),), origin="model")


def speculative_sizes_after_breaks(log) -> list[list[int]]:
    """Per stretch after a one-token run of the pending token: the sizes of the speculative
    runs started."""
    stretches: list[list[int]] = []
    for a in log:
        if isinstance(a, A.StartRun) and not a.tx.speculative and len(a.tokens) == 1:
            stretches.append([])
        elif isinstance(a, A.StartRun) and a.tx.speculative and stretches:
            stretches[-1].append(len(a.tokens))
    return [s for s in stretches if s]


def test_ngram_chains_start_short_after_every_break_and_stay_exact():
    """Text that copies the prompt with an edit every 19 tokens, a pipeline six runs deep:
    after every mismatch the chain of n-gram runs starts again with 1, then 2, then 3 tokens,
    and the output is the target's."""
    sched = make(PipeInfer, n_predict=120, draft=3)
    log = drive(sched, NgramDrafts(2, 4), depth=6, target=EDITED)
    assert sched.gen.tokens == EDITED[len(PROMPT):len(PROMPT) + 120]
    stretches = speculative_sizes_after_breaks(log)
    assert len(stretches) >= 5                       # one per edit at least
    for sizes in stretches:
        assert sizes[:3] == [1, 2, 3][:len(sizes)], stretches
        assert max(sizes) <= 3
    assert any(s[:4] == [1, 2, 3, 3] for s in stretches)   # then full size
    ramps = [a for a in log if isinstance(a, A.PolicyChanged) and a.name == "ramp"]
    assert ramps and all(a.value == 1 for a in ramps)
