"""Which drafts `--draft-source both` takes (schedule/sources.py), on scripted outcomes and in
the n-gram executor: n-gram drafts while they are accepted about as often as the model's, the
model's (with a probe of the lookup now and then) once they are clearly worse, and back."""

from __future__ import annotations

from pipeinfer.engine.drafting.ngram_drafts import NgramDrafts
from pipeinfer.schedule.actions import DraftJob
from pipeinfer.schedule.sources import SourceChoice


def test_lookups_first_while_nothing_is_known():
    choice = SourceChoice()
    assert all(choice.use_ngram() for _ in range(20))
    choice.observe("ngram", 4, 0)          # the model's record is still unknown
    assert choice.use_ngram()


def test_poor_ngram_drafts_give_way_to_the_model_with_probes():
    choice = SourceChoice(margin=0.1, probe=8)
    for _ in range(10):
        choice.observe("model", 4, 4)
        choice.observe("ngram", 4, 1)
    assert not choice.prefers_ngram
    # every n-gram run that left while the model was preferred doubled the probe interval
    assert choice.interval == 64
    answers = [choice.use_ngram() for _ in range(256)]
    assert sum(answers) == 4               # one job in 64 still tries the lookup


def test_probe_interval_doubles_and_resets():
    choice = SourceChoice(margin=0.1, probe=8, max_probe=64)
    for _ in range(10):
        choice.observe("model", 4, 4)
    intervals = []
    for _ in range(5):
        choice.observe("ngram", 4, 0)
        intervals.append(choice.interval)
    assert intervals == [16, 32, 64, 64, 64]
    gap = 0
    while not choice.use_ngram():
        gap += 1
    assert gap + 1 == 64                   # the next probe comes 64 jobs later
    for _ in range(20):                    # the text starts repeating: probes pay
        choice.observe("ngram", 8, 8)
    assert choice.prefers_ngram and choice.interval == 8


def test_ngram_drafts_come_back_when_they_pay_again():
    choice = SourceChoice(margin=0.1)
    for _ in range(10):
        choice.observe("model", 4, 3)
        choice.observe("ngram", 4, 0)
    assert not choice.prefers_ngram
    for _ in range(20):                    # the text starts repeating: probes are accepted
        choice.observe("ngram", 8, 8)
    assert choice.prefers_ngram


def test_close_records_keep_the_free_lookup():
    choice = SourceChoice(margin=0.1)
    for _ in range(10):
        choice.observe("model", 10, 9)
        choice.observe("ngram", 10, 8)
    assert choice.prefers_ngram


class _Model:
    """A stand-in fallback executor that records what reached it."""

    def __init__(self):
        self.jobs = []

    def submit(self, job):
        self.jobs.append(job.job_id)


def test_executor_leaves_model_jobs_to_the_model():
    model = _Model()
    drafts = NgramDrafts(2, 4, fallback=model)
    context = (1, 2, 3, 4, 1, 2, 3)
    drafts.submit(DraftJob(0, context, None, 0.3, 4))               # a lookup hit
    drafts.submit(DraftJob(1, context, None, 0.3, 4, ngram=False))  # the model's
    ready = drafts.poll()
    assert ready.job_id == 0 and ready.origin == "ngram" and ready.branches == ((4, 1, 2, 3),)
    assert model.jobs == [1]
