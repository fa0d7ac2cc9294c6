"""The head's draft model keeps its context of each served request on disk
(engine/drafting/drafter.py, engine/head/kept.py), so that after a failure a resumed
request's draft reads only what follows the kept tokens. Real llama.cpp draft stages, real
files; the whole path on the emulated service is in test_kept_cells.py (3-pipeinfer)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pipeinfer.engine.drafting.drafter import KEEP_EVERY, Drafter
from pipeinfer.engine.head.kept import Keeper
from pipeinfer.job.restore import Restored
from pipeinfer.model.kept_cells import DRAFT, KeptCells, identity_of
from pipeinfer.model.stage import Stage, StageConfig
from support.tiny_set import N_BATCH

CONTEXT = list(range(100, 180))       # 80 tokens (> 4 + KEEP_EVERY)
TAIL = [7, 8, 9, 10, 11]


class Counting:
    """A draft stage that counts the positions it evaluates (everything else is the stage's)."""

    def __init__(self, stage: Stage):
        self.stage, self.evaluated = stage, 0

    def decode(self, positions, *args, **kw):
        self.evaluated += len(positions)
        return self.stage.decode(positions, *args, **kw)

    def __getattr__(self, name):
        return getattr(self.stage, name)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path))
    monkeypatch.setenv("PIPEINFER_FRONT_KEY", "cd" * 32)
    monkeypatch.delenv("PIPEINFER_KEEP_CELLS", raising=False)
    return KeptCells.for_job(identity_of(DRAFT, "tiny"), sub=DRAFT)


@pytest.fixture
def stages(tiny):
    made = []

    def make() -> Counting:
        made.append(Stage(tiny.aligned, StageConfig(n_ctx=256, n_batch=N_BATCH, n_seq_max=1),
                          final=True, label="draft"))
        return Counting(made[-1])
    yield make
    for stage in made:
        stage.close()


def test_a_kept_draft_context_is_taken_back_and_only_the_rest_is_read(store, stages):
    first = Drafter(stages(), N_BATCH)
    first.keep_as(store, 5)
    first.sync(CONTEXT)
    assert store.read(5)[0].tokens == tuple(CONTEXT)    # (the first copy at once)
    second = Drafter(stages(), N_BATCH)                 # the next job's draft model
    keeper = Keeper(None, {5: Restored(5, 0, tuple(CONTEXT), 30)}, 32, drafts=store)
    keeper.take_back_drafts(lambda slot: second)
    assert second.n_held == len(CONTEXT)
    got = second.sync(CONTEXT + TAIL)
    assert second.stage.evaluated == len(TAIL)
    expected = first.sync(CONTEXT + TAIL)               # from the same cells, the same runs
    assert np.array_equal(got, expected)


def test_copies_follow_the_context_and_end_with_the_request(store, stages):
    drafter = Drafter(stages(), N_BATCH)
    drafter.keep_as(store, 6)
    drafter.sync(CONTEXT[:4])
    assert store.read(6)[0].n == 4                      # the first at once (the prompt)
    drafter.sync(CONTEXT[:4 + KEEP_EVERY - 1])
    assert store.read(6)[0].n == 4                      # not grown by KEEP_EVERY yet
    drafter.sync(CONTEXT[:4 + KEEP_EVERY])
    assert store.read(6)[0].n == 4 + KEEP_EVERY
    keeper = Keeper(store, {}, 32, drafts=store)
    keeper.started(0, 6, 0)
    keeper.ended(0, drafter)
    assert store.read(6)[0] is None
    drafter.sync(CONTEXT)                               # (keeps nothing any more)
    assert store.read(6)[0] is None


def test_a_copy_of_another_draft_or_damaged_or_refused_is_not_used(store, stages, caplog):
    first = Drafter(stages(), N_BATCH)
    other = KeptCells(store.dir, identity_of(DRAFT, "another draft file"))
    first.keep_as(other, 7)
    first.sync(CONTEXT)
    first.keep_as(store, 8)
    first.sync(CONTEXT + TAIL * 4)
    path = store.path(8)
    path.write_bytes(path.read_bytes()[:-10])           # truncated
    second = Drafter(stages(), N_BATCH)
    keeper = Keeper(None, {7: Restored(7, 0, tuple(CONTEXT), 30),
                           8: Restored(8, 0, tuple(CONTEXT), 30)}, 32, drafts=store)
    with caplog.at_level(logging.INFO):
        keeper.take_back_drafts(lambda slot: second)
    assert other.read(7)[0] is not None                 # (there, but of another draft)
    assert "draft context of request 7: not kept (no copy)" in caplog.text
    assert "draft context of request 8: not kept (truncated or damaged)" in caplog.text
    assert second.n_held == 0
    second.take_back(CONTEXT, b"not a sequence state")  # llama.cpp refuses it: read again
    got = second.sync(CONTEXT)
    assert second.stage.evaluated == len(CONTEXT)
    fresh = Drafter(stages(), N_BATCH)
    assert np.array_equal(got, fresh.sync(CONTEXT))


def test_a_job_of_another_size_takes_the_draft_copies_back(store, tiny, tmp_path):
    """A lost host changes the job's size, and with it the draft's context size and
    vocabulary cut: neither changes the draft's cells, so the copies stay usable."""
    from types import SimpleNamespace
    from pipeinfer.job.restore import draft_store
    drafts = [SimpleNamespace(path=tiny.aligned)]
    four = SimpleNamespace(kv_size=4096, n_batch=64, draft_vocab=32768, threads_for=lambda r: 1)
    three = SimpleNamespace(kv_size=2048, n_batch=32, draft_vocab=0, threads_for=lambda r: 2)
    assert draft_store(four, drafts).identity == draft_store(three, drafts).identity
    other = tmp_path / "other.gguf"
    other.write_bytes(b"another draft")
    assert draft_store(four, [SimpleNamespace(path=other)]).identity != \
        draft_store(four, drafts).identity
