"""A stand-in draft executor for the n-gram executors' tests (test_ngram.py, its tree form in
test_ngram_specpipe.py): it records the calls the executor under test passes on to it and hands
back what its `submit` (defined by each test's subclass) put in `ready`."""

from __future__ import annotations


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

    def stop(self, job_id):
        self.calls.append(("stop", job_id))

    def poll(self):
        return self.ready.pop(0) if self.ready else None

    def close(self):
        self.calls.append("close")
