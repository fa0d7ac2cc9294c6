"""Kept KV cells (model/kept_cells.py, job/restore.py, engine/head/kept.py): the ranks of a
served job keep copies of their requests' cells on disk, and the job started after a
failure takes them back, so a request resumes evaluating only what follows them. Real front,
real mpiexec, real SIGKILLs, real HTTP clients: every answer equals the undisturbed one and
the log shows the cells taken back; copies that are damaged, of another stage or of other
tokens are never used (real llama.cpp stage, real files)."""

from __future__ import annotations

import logging
import re
import time

import numpy as np
import pytest

from support.failover import PROMPTS, complete, kill_mid_stream
from support.serving import Server

from pipeinfer.engine.head.kept import Keeper
from pipeinfer.job.assemble import StageCopies
from pipeinfer.job.restore import restore
from pipeinfer.model.kept_cells import TOKENS, KeptCells, identity_of, token_digest
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.schedule.generation import Request

TAKEN = re.compile(r"kept cells of request (\d+): (\d+) of its (\d+) tokens on every rank")
DRAFT_TAKEN = re.compile(r"draft context of request \d+: \d+ tokens taken back")


class OneRank:
    """The collectives of a job of one rank (restore() is collective)."""
    rank = 0

    def bcast(self, obj):
        return obj

    def gather(self, obj):
        return [obj]


# --- on the emulated service: kill a rank, the cells come back ------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("ranks, options", [
    (3, ("--no-cache-prompt",)),
    (4, ("--no-cache-prompt",)),
    (3, ("--strategy", "pipeinfer", "-md", "{draft}")),   # speculating, the prompt cache on
], ids=["3-iterative", "4-iterative", "3-pipeinfer"])
def test_a_killed_worker_resumes_from_kept_cells_exactly(smollm2, tmp_path, monkeypatch,
                                                        ranks, options):
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path / "cache"))   # (the ranks' disks)
    options = [o.format(draft=smollm2) for o in options]
    srv = Server(tmp_path, ranks, "-m", str(smollm2), "--parallel", "4", *options,
                 "--max-restarts", "5")
    try:
        srv.wait_ready()
        undisturbed = {p: complete(srv.url, p) for p in PROMPTS}
        streams, _ = kill_mid_stream(srv, ranks - 1)
        for s, prompt in zip(streams, PROMPTS):
            assert s.error is None and s.done, (s.error, srv.stderr[-3000:])
            assert s.text == undisturbed[prompt], (prompt, s.text, undisturbed[prompt])
        taken = [(int(n), int(of)) for _, n, of in TAKEN.findall(srv.stderr)]
        assert len(taken) == len(PROMPTS), srv.stderr[-4000:]
        assert all(n > 0 for n, _ in taken), taken
        if "-md" in options:   # (the head's draft model took its contexts back too)
            assert DRAFT_TAKEN.search(srv.stderr), srv.stderr[-4000:]
        # (the relaunched ranks loaded their stages while the head planned: preload.py)
        assert "loaded early" in srv.stderr, srv.stderr[-3000:]
        deadline = time.monotonic() + 30
        while (left := _copies(tmp_path / "cache")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"copies left after every request ended: {left}"
    finally:
        srv.kill()


def _copies(cache) -> list:
    return [p.name for p in (cache / "kept").rglob("*") if p.suffix in (".cells", ".tokens")]


# --- the store and restore() on a real stage ----------------------------------------------
@pytest.fixture
def store_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path))
    monkeypatch.setenv("PIPEINFER_FRONT_KEY", "ab" * 32)
    monkeypatch.delenv("PIPEINFER_KEEP_CELLS", raising=False)
    return tmp_path


def _stage(model) -> Stage:
    return Stage(model, StageConfig(n_ctx=256, n_batch=64, n_slots=3))


def _prefill(stage: Stage, tokens, slot: int = 0) -> np.ndarray:
    n = len(tokens)
    return stage.decode(list(range(n)), [(0,)] * n, tokens=list(tokens),
                        logit_rows=[i == n - 1 for i in range(n)], slot=slot)


def _next(stage: Stage, token: int, pos: int, slot: int = 0) -> np.ndarray:
    return stage.decode([pos], [(0,)], tokens=[token], logit_rows=[True], slot=slot)


def _kept_request(stage, cells: KeptCells, tokens: KeptCells, key: int, prompt, n_prompt):
    digest = token_digest(prompt)
    cells.save_stage(stage, 0, 0, key, len(prompt), digest)
    tokens.save(key, len(prompt), digest, b"", n_prompt, prompt)


def test_cells_taken_back_compute_as_the_undisturbed_ones(tiny_model, store_env):
    prompt = list(range(100, 140))
    with _stage(tiny_model) as first:
        _prefill(first, prompt)
        expected = _next(first, 7, len(prompt))
        cells = KeptCells.for_job(identity_of("stage"))
        tokens = KeptCells.for_job(identity_of(TOKENS))
        _kept_request(first, cells, tokens, 5, prompt, 32)
    with _stage(tiny_model) as second:   # the next job's rank
        restored = restore(OneRank(), second, StageCopies(cells, None, ()), n_slots=2)
        assert list(restored) == [5] and restored[5].tokens == tuple(prompt)
        slot = restored[5].slot   # (the copy holds position 40 too: the lane cuts it off)
        second.seq_rm(0, len(prompt), -1, slot=slot)
        got = _next(second, 7, len(prompt), slot=slot)
    assert np.array_equal(got, expected)


def test_damaged_foreign_and_stale_copies_are_never_used(tiny_model, store_env, caplog):
    prompt = list(range(100, 140))
    cells = KeptCells.for_job(identity_of("stage"))
    tokens = KeptCells.for_job(identity_of(TOKENS))
    with _stage(tiny_model) as stage:
        _prefill(stage, prompt)
        for key in (1, 2, 3):
            _kept_request(stage, cells, tokens, key, prompt, 32)
        foreign = KeptCells(cells.dir, identity_of("another split"))   # request 2: another
        foreign.save_stage(stage, 0, 0, 2, len(prompt), token_digest(prompt))   # stage's,
        foreign.path(2).replace(cells.path(2))                         # under this one's name
        path = cells.path(1)                                           # request 1: truncated
        path.write_bytes(path.read_bytes()[:-100])
        tokens.save(3, len(prompt), token_digest(prompt), b"", 32,    # request 3: the head's
                    [9] + prompt[1:])                                  # tokens are others
        caplog.set_level(logging.INFO)
        restored = restore(OneRank(), stage, StageCopies(cells, None, ()), n_slots=3)
    assert restored == {}
    said = caplog.text
    assert "kept cells of request 1: 0 of its 40 tokens on every rank (rank 0: truncated" in said
    assert "request 2: 0 of its 40 tokens on every rank (rank 0: of another model" in said
    assert "request 3: 0 of its 40 tokens on every rank (rank 0: of other tokens)" in said


class OtherRankHasNone(OneRank):
    """A job of two ranks whose other rank found no copy of anything."""

    def gather(self, obj):
        return [obj, [(key, 0, 0, "no copy") for key, *_ in obj]]


def test_cells_one_rank_took_back_are_dropped_when_another_has_none(tiny_model, store_env):
    prompt = list(range(100, 140))
    cells = KeptCells.for_job(identity_of("stage"))
    tokens = KeptCells.for_job(identity_of(TOKENS))
    with _stage(tiny_model) as stage:
        _prefill(stage, prompt)
        _kept_request(stage, cells, tokens, 4, prompt, 32)
    with _stage(tiny_model) as stage:
        copies = StageCopies(cells, None, ())
        assert restore(OtherRankHasNone(), stage, copies, n_slots=2) == {}
        assert stage.seq_pos_max(0, slot=0) == -1   # (a request there starts from nothing)


def test_without_a_front_or_turned_off_nothing_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path))
    monkeypatch.delenv("PIPEINFER_FRONT_KEY", raising=False)
    assert KeptCells.for_job(identity_of("stage")) is None
    monkeypatch.setenv("PIPEINFER_FRONT_KEY", "cd" * 32)
    monkeypatch.setenv("PIPEINFER_KEEP_CELLS", "0")
    assert KeptCells.for_job(identity_of("stage")) is None


# --- what a resumed request reuses -----------------------------------------------------------
class _Restored:
    def __init__(self, tokens, slot=1):
        self.key, self.slot, self.tokens, self.n_prompt = 9, slot, tuple(tokens), 0


@pytest.mark.parametrize("kept, n_prompt, resumed, reused", [
    (150, 100, 60, 150),    # into the answer: every kept cell (answer runs are exact-sized)
    (100, 100, 0, 64),      # the whole prompt, nothing sent yet: its last token again, from
                            # the last whole chunk
    (90, 100, 20, 64),      # part of the prompt: from the last whole chunk
    (160, 100, 60, 159),    # everything: the last token is evaluated again (its row)
    (30, 100, 20, 0),       # less than a chunk of the prompt: nothing
])
def test_a_resumed_request_reuses_what_a_rebuild_computes_alike(kept, n_prompt, resumed,
                                                                 reused):
    tokens = list(range(1000, 1000 + n_prompt + resumed))
    keeper = Keeper(None, {9: _Restored(tokens[:kept])}, chunk=64)
    request = Request(tuple(tokens[:n_prompt]), 256, 4096, resumed=tuple(tokens[n_prompt:]))
    assert keeper.claim(9, [0, 1, 2], request) == (1, reused)


def test_cells_of_another_prompt_are_reused_only_as_far_as_they_agree():
    tokens = list(range(1000, 1200))
    other = tokens[:130] + [5] * 40
    keeper = Keeper(None, {9: _Restored(other)}, chunk=64)
    request = Request(tuple(tokens[:150]), 256, 4096, resumed=tuple(tokens[150:]))
    assert keeper.claim(9, [1], request) == (1, 128)


def test_a_slot_another_request_took_is_not_claimed():
    keeper = Keeper(None, {9: _Restored(range(100), slot=2)}, chunk=64)
    request = Request(tuple(range(100)), 256, 4096)
    assert keeper.claim(9, [0, 1], request) is None


def test_copies_no_request_rewrites_and_dead_fronts_dirs_are_swept(store_env):
    import os

    from pipeinfer.model import kept_cells
    cells = KeptCells.for_job(identity_of("stage"))
    for key in (1, 2):
        cells.save(key, 4, token_digest([1, 2, 3, 4]), b"cells")
    old = time.time() - kept_cells.ORPHAN_S - 5
    os.utime(cells.path(1), (old, old))                # no request rewrote it for 30 min
    dead = cells.dir.parent / "0123456789abcdef"       # a front killed a day ago
    dead.mkdir()
    (dead / "7-0.cells").write_bytes(b"x")
    os.utime(dead, (time.time() - kept_cells.STALE_S - 5,) * 2)
    cells.sweep()
    assert cells.keys() == [2] and not dead.exists()


def test_copies_written_on_the_writer_thread_keep_their_order(store_env):
    from pipeinfer.model.kept_writer import Writer
    store = KeptCells.for_job(identity_of("stage"), (0, 4))
    store.writer = Writer()
    body = bytes(range(256)) * 4096                     # 1 MB a copy
    for n in range(1, 21):
        store.save(3, n, n, body)
        store.save(4, n, n, body)
    store.drop(3)                                       # after all of 3's writes
    store.flush()
    assert store.read(3) == (None, "no copy")
    assert store.read(4)[0].n == 20
    store.drop_every(but=[4])
    store.clear()
    store.flush()
    assert store.keys(every=True) == []
