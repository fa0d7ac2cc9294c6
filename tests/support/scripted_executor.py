"""Stand-in draft executors for the n-gram executors' tests (test_ngram.py, its tree form in
test_ngram_specpipe.py, test_ramp.py): ScriptedExecutor records the calls the executor under
test passes on to it and hands back what its `submit` (defined by each subclass) put in
`ready`; ScriptedModel drafts a target's next tokens, as a draft model would."""

from __future__ import annotations

from pipeinfer.schedule.events import DraftReady


class ScriptedExecutor:
    def __init__(self):
        self.ready, self.calls = [], []

    def warm(self, tokens):
        self.calls.append("warm")

    def idle(self):
        self.calls.append("idle")
        return False

    def submit(self, job):
        raise NotImplementedError

    def stop(self, job_id, stale=False):
        self.calls.append(("stop", job_id))

    def poll(self):
        return self.ready.pop(0) if self.ready else None

    def close(self):
        self.calls.append("close")


class ScriptedModel(ScriptedExecutor):
    """A stand-in draft model executor: drafts `target`'s next tokens (origin "model")."""

    def __init__(self, target=()):
        super().__init__()
        self.target = list(target)

    def submit(self, job):
        n = len(job.context)
        self.calls.append(("submit", job.job_id))
        self.ready.append(DraftReady(job.job_id, (tuple(self.target[n:n + job.budget]),)))
