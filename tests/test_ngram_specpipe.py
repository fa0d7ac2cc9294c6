"""N-gram drafts for specpipe's tree (issue 22 item 1): the candidates lookup on constructed
sequences, the tree-draft executor on constructed jobs (the draft's sequences mirrored as
token lists, candidates per row, rows without a match, the model's rows kept where nothing
matches), BeamTree.choose on sparse rows (levels narrower than the width, none at all), the
schedule driven with the executor (no MPI, no llama.cpp), and exactness under mpiexec:
specpipe with `--draft-source ngram` (no -md) and `both` gives the oracle's greedy tokens
with n-gram drafts accepted."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeinfer.config.drafts import resolve_draft_source
from pipeinfer.config.job import JobConfig
from pipeinfer.engine.drafting.ngram_tree_drafts import NO_MATCH, NgramTreeDrafts, TokenMirror
from pipeinfer.schedule import actions as A
from pipeinfer.schedule.events import ResultArrived, Start, Tick
from pipeinfer.schedule.generation import Generation, Request
from pipeinfer.schedule.ngram import ngram_candidates
from pipeinfer.schedule.options import Limits, SpecOptions
from pipeinfer.schedule.partition_pool import PartitionPool
from pipeinfer.schedule.specpipe import SpecPipe
from pipeinfer.schedule.specpipe_tree import BeamTree
from pipeinfer.schedule.transaction import RunResult, seq_cp, seq_keep, seq_rm
from pipeinfer.schedule.tree_draft import (Adopt, SparseLogits, StartTreeDraft, TreeDraftJob,
                                           TreeDraftReady)
from support.ngram_runs import CODE_PROMPT, N_CODE, SPLIT, oracle, run
from support.schedule_script import result_for
from support.scripted_executor import ScriptedExecutor


# --- the lookup ------------------------------------------------------------------------------

def test_candidates_ranked_by_count_then_latest():
    # after [1, 2]: 3 twice, 4 once (latest of all), 5 once (earlier)
    context = [1, 2, 5, 1, 2, 3, 9, 1, 2, 3, 1, 2, 4, 8, 1, 2]
    assert ngram_candidates(context, 2, 4) == [(3, 2), (4, 1), (5, 1)]


def test_candidates_of_the_longest_suffix_only():
    # [7, 1, 2] occurred once (then 6); the shorter [1, 2] also before 3 and 4
    context = [1, 2, 3, 7, 1, 2, 6, 1, 2, 4, 7, 1, 2]
    assert ngram_candidates(context, 2, 4) == [(6, 1)]
    assert ngram_candidates(context, 2, 2) == [(4, 1), (6, 1), (3, 1)]   # the latest first


def test_no_candidates_without_a_match():
    assert ngram_candidates([1, 2, 3, 4], 2, 4) == []
    assert ngram_candidates([1, 2, 1], 2, 4) == []
    assert ngram_candidates([1, 2, 1], 1, 4) == [(2, 1)]
    assert ngram_candidates([], 1, 4) == [] and ngram_candidates([3], 1, 4) == []
    with pytest.raises(ValueError):
        ngram_candidates([1, 2], 3, 2)


# --- the executor ----------------------------------------------------------------------------

def tokens_of(row: SparseLogits) -> list[int]:
    return list(row.tokens)


def test_mirror_applies_the_draft_ops():
    m = TokenMirror()
    m.sync([1, 2, 3, 4])
    m.apply(seq_rm(1))
    m.apply(seq_cp(0, 1, -1, 4))                  # slot 0 continues the context
    assert m.decode(1, 4, 7) == [1, 2, 3, 4, 7]
    m.apply(seq_cp(1, 2, -1, 5))                  # a branch: slot 1 gets slot 0's path
    assert m.decode(2, 5, 9) == [1, 2, 3, 4, 7, 9]
    assert m.decode(1, 5, 8) == [1, 2, 3, 4, 7, 8]
    m.apply(Adopt(1, 7))                          # the hit on 7 joins sequence 0
    assert m.seqs[0] == [1, 2, 3, 4, 7]
    m.apply(seq_rm(2, 5))                         # a tail cut
    assert m.seqs[2] == [1, 2, 3, 4, 7]
    with pytest.raises(ValueError, match="gap"):
        m.apply(seq_cp(0, 3, 2, 4))               # a range onto an empty sequence
    with pytest.raises(ValueError, match="gap"):
        m.apply(seq_rm(1, 1, 2))                  # a hole in the middle
    with pytest.raises(ValueError, match="gap"):
        m.decode(2, 9, 1)
    m.apply(seq_keep(1))
    assert set(m.seqs) == {1}


def job(job_id, decodes=(), ops=(), sync=None) -> TreeDraftJob:
    return TreeDraftJob(job_id, tuple(ops), tuple(decodes), sync)


CONTEXT = [5, 1, 2, 3, 1, 2, 4, 1, 2]   # after [1, 2]: 3 and 4 (4 the latest)


def test_executor_answers_rows_then_the_sync():
    drafts = NgramTreeDrafts(2, 4)
    drafts.warm(CONTEXT), drafts.idle()             # nothing to warm without a model
    drafts.submit(job(0, sync=CONTEXT))
    ready = drafts.poll()
    assert isinstance(ready, TreeDraftReady) and ready.job_id == 0 and drafts.poll() is None
    (row,) = ready.rows
    assert tokens_of(row) == [4, 3] and row.logits == (0.0, 0.0) and row.origin == "ngram"
    # the next level: slot 0 (sequence 1) continues the context, slot 1 branches off it
    ops = [seq_rm(1), seq_cp(0, 1, -1, len(CONTEXT)), seq_rm(2), seq_cp(1, 2, -1, 9)]
    drafts.submit(job(1, decodes=[(1, 9, 3), (2, 9, 6)], ops=ops))
    rows = drafts.poll().rows
    assert drafts.mirror.seqs[1] == CONTEXT + [3] and drafts.mirror.seqs[2] == CONTEXT + [6]
    assert tokens_of(rows[0]) == [1]              # [2, 3] was followed by 1
    assert rows[1] == NO_MATCH                    # [2, 6] never occurred
    drafts.submit(job(2, decodes=[(1, 10, 1)]))   # [1, 2, 3, 1] was followed by 2
    assert tokens_of(drafts.poll().rows[0]) == [2]
    drafts.stop(2), drafts.close()


def test_counts_become_probabilities():
    drafts = NgramTreeDrafts(1, 1)
    drafts.submit(job(0, sync=[9, 1, 9, 1, 9, 2, 9]))
    (row,) = drafts.poll().rows
    assert tokens_of(row) == [1, 2]
    assert np.allclose(np.exp(row.logits) / np.exp(row.logits).sum(), [2 / 3, 1 / 3])


class ScriptedTreeModel(ScriptedExecutor):
    """A stand-in for TreeDrafts: a dense row per decode (then the sync), token 0 on top."""

    def __init__(self, vocab=32):
        super().__init__()
        self.vocab = vocab

    def submit(self, job):
        self.calls.append(("submit", job.job_id))
        n = len(job.decodes) + (job.sync is not None)
        rows = [np.eye(self.vocab, dtype=np.float32)[0] * 5 for _ in range(n)]
        self.ready.append(TreeDraftReady(job.job_id, (), rows=tuple(rows)))


def test_with_a_model_the_lookup_overrides_matching_rows_only():
    model = ScriptedTreeModel()
    drafts = NgramTreeDrafts(2, 4, fallback=model)
    drafts.warm(CONTEXT)
    drafts.submit(job(0, sync=CONTEXT))
    ops = [seq_rm(1), seq_cp(0, 1, -1, len(CONTEXT)), seq_rm(2), seq_cp(1, 2, -1, 9)]
    drafts.submit(job(1, decodes=[(1, 9, 3), (2, 9, 6)], ops=ops))
    first, second = drafts.poll(), drafts.poll()
    assert tokens_of(first.rows[0]) == [4, 3]
    assert tokens_of(second.rows[0]) == [1]
    assert isinstance(second.rows[1], np.ndarray)       # no match: the model's row
    drafts.stop(1), drafts.close()
    assert model.calls == ["warm", ("submit", 0), ("submit", 1), ("stop", 1), "close"]


def test_executor_refuses_crossed_sizes():
    with pytest.raises(ValueError):
        NgramTreeDrafts(3, 2)


# --- choosing a level from sparse rows ---------------------------------------------------------

def sparse(*tokens, counts=None) -> SparseLogits:
    counts = counts or [1] * len(tokens)
    return SparseLogits(tuple(tokens), tuple(float(np.log(c)) for c in counts))


def test_choose_takes_only_named_candidates():
    tree = BeamTree(width=3, k=2)
    root = tree.reset(5, 10)
    level = tree.choose({root: sparse(7)})
    assert [(c.token, c.slot, c.origin) for c in level] == [(7, 0, "ngram")]   # 1 of 3
    a = tree.grow(level)[0]
    level = tree.choose({a: sparse(8, 9, 4, counts=[3, 2, 2])})            # k=2 of them
    assert [c.token for c in level] == [8, 9] and level[1].copy
    b, c = tree.grow(level)
    assert tree.choose({b: NO_MATCH, c: NO_MATCH}) == []                   # no level
    level = tree.choose({b: NO_MATCH, c: sparse(1)})
    assert [(x.parent, x.token, x.slot) for x in level] == [(c, 1, 1)]
    assert tree.choose({b: sparse(), c: sparse()}) == []


def test_choose_drops_negligible_candidates_of_dense_rows():
    tree = BeamTree(width=4, k=3)
    root = tree.reset(5, 10)
    z = np.full(50, -1e4, dtype=np.float32)
    z[[3, 8]] = 0.0                       # pseudo-logits: two candidates, the rest ~zero
    assert [c.token for c in tree.choose({root: z})] == [3, 8]
    assert all(c.origin == "model" for c in tree.choose({root: z}))


def test_ngram_rows_win_over_unsure_model_rows():
    tree = BeamTree(width=2, k=2)
    root = tree.reset(5, 10)
    a, b = tree.grow(tree.choose({root: sparse(1, 2)}))
    unsure = np.zeros(50, dtype=np.float32)           # the model: 1/50 each
    level = tree.choose({a: unsure, b: sparse(9, 8)})  # the lookup: 1/2 each
    assert [(c.parent, c.token, c.origin) for c in level] == [(b, 9, "ngram"), (b, 8, "ngram")]
    assert level[1].copy and level[1].slot == 0        # into the slot of a's dead beam


# --- the schedule with the executor ------------------------------------------------------------

PATTERN = [31, 32, 33, 34, 35, 36, 37]
PROMPT = tuple([5, 6] + PATTERN * 2)
# repeats the prompt's pattern, says something new, repeats again, then only new tokens
TARGET = list(PROMPT) + PATTERN * 3 + list(range(60, 75)) + PATTERN * 4 + list(range(100, 300))


def make(width=3, k=2, n_predict=60, n_stages=3, prompt=PROMPT, **opts) -> SpecPipe:
    spec = SpecOptions(tree_width=width, tree_k=k, **opts)
    gen = Generation(Request(prompt, n_predict, 512), lambda t: False)
    return SpecPipe(gen, None, Limits(64, 512, 2048, n_stages), spec, PartitionPool(1, width))


def drive(sched: SpecPipe, drafts, target=TARGET, rng: random.Random | None = None,
          depth: int = 3) -> list:
    """The generation to its end: a result comes back when `depth` runs are in flight or
    nothing else happens (with `rng`: in a random order of results, draft answers and
    ticks; cancelled runs come back empty or computed). Every action, in order."""
    flight, cancelled, log = [], set(), []

    def feed(event) -> bool:
        actions = sched.step(event)
        log.extend(actions)
        for a in actions:
            if isinstance(a, A.StartRun):
                flight.append(a)
            elif isinstance(a, A.CancelRuns):
                cancelled.update(a.run_ids)
            elif isinstance(a, StartTreeDraft):
                drafts.submit(a.job)
            elif isinstance(a, A.WarmDraft):
                drafts.warm(a.tokens)
        return bool(actions)

    def finish_oldest() -> None:
        start = flight.pop(0)
        if start.run_id in cancelled and (rng is None or rng.random() < 0.5):
            feed(ResultArrived(start.run_id, RunResult(start.run_id, None)))
        else:
            feed(result_for(start, target))

    feed(Start())
    for _ in range(100_000):
        if sched.finished:
            break
        if rng is not None:
            x = rng.random()
            if x < 0.4 and flight:
                finish_oldest()
            elif x < 0.7 and (event := drafts.poll()) is not None:
                feed(event)
            else:
                feed(Tick())
        elif (event := drafts.poll()) is not None:
            feed(event)
        elif not flight:
            assert feed(Tick()), "nothing in flight and nothing to do"
        elif len(flight) >= depth or not feed(Tick()):
            finish_oldest()
    assert sched.finished
    while flight:
        finish_oldest()
    return log


def check_end(sched: SpecPipe, drafts: NgramTreeDrafts, target=TARGET) -> None:
    n = sched.gen.request.n_predict
    prompt = sched.gen.request.prompt
    assert sched.gen.tokens == target[len(prompt):len(prompt) + n]
    assert sched.pool.all_free and sched.in_flight == 0
    c = sched.gen.counters
    assert c.tree_steps == n - 1 and c.n_accepted == c.tree_hits <= c.n_drafted
    width = sched.opts.tree_width
    assert all(not drafts.mirror.seqs.get(1 + s) for s in range(width))   # slots emptied


def test_ngram_tree_through_the_schedule_is_exact_and_counted():
    sched, drafts = make(), NgramTreeDrafts(2, 4)
    log = drive(sched, drafts)
    check_end(sched, drafts)
    c = sched.gen.counters
    assert c.n_drafted == c.n_drafted_ngram > 0
    assert c.n_accepted == c.n_accepted_ngram > 20         # the repeats are predicted
    sizes = [len(a.tokens) for a in log if isinstance(a, A.StartRun) and a.tx.speculative]
    assert min(sizes) < sched.opts.tree_width              # levels narrower than the width


def test_no_candidates_means_plain_decoding():
    """Text that never repeats: no level is ever grown, the schedule decodes token by
    token and finishes."""
    prompt = (5, 6, 7, 8)
    target = list(prompt) + list(range(100, 200))
    sched, drafts = make(prompt=prompt, n_predict=30), NgramTreeDrafts(2, 4)
    log = drive(sched, drafts, target)
    check_end(sched, drafts, target)
    c = sched.gen.counters
    assert c.runs_speculative == 0 == c.n_drafted and c.flushes == 0
    assert sum(isinstance(a, StartTreeDraft) for a in log) >= 30   # a lookup per token


def test_both_sources_are_counted_apart():
    class TargetModel(ScriptedTreeModel):
        """Dense rows that put the target's next token first (and a wrong one second)."""

        def submit(self, job):
            rows = [dense(TARGET[pos + 1]) for _, pos, _ in job.decodes]
            if job.sync is not None:
                rows.append(dense(TARGET[len(job.sync)]))
            self.ready.append(TreeDraftReady(job.job_id, (), rows=tuple(rows)))

    def dense(token):
        z = np.zeros(400, dtype=np.float32)
        z[token], z[399] = 8.0, 6.0
        return z

    sched = make(draft_source="both")
    drafts = NgramTreeDrafts(2, 4, fallback=TargetModel())
    drive(sched, drafts)
    check_end(sched, drafts)
    c = sched.gen.counters
    assert 0 < c.n_drafted_ngram < c.n_drafted
    assert 0 < c.n_accepted_ngram < c.n_accepted


@pytest.mark.parametrize("seed", range(8))
def test_exact_under_random_timing(seed):
    rng = random.Random(seed)
    sched = make(width=rng.randint(1, 4), k=rng.randint(1, 3), n_predict=50,
                 n_stages=rng.randint(1, 4), max_runs=rng.randint(2, 6),
                 cancel=rng.random() < 0.7)
    drafts = NgramTreeDrafts(rng.randint(1, 2), rng.randint(2, 4))
    drive(sched, drafts, rng=rng)
    check_end(sched, drafts)


# --- configuration -----------------------------------------------------------------------------

def test_specpipe_defaults_to_ngrams_pipespec_does_not():
    assert resolve_draft_source("specpipe", None, has_draft=False) == "ngram"
    assert resolve_draft_source("specpipe", None, has_draft=True) == "both"
    assert resolve_draft_source("pipespec", None, has_draft=True) == "model"
    JobConfig("m.gguf", strategy="specpipe",
              spec=SpecOptions(draft_source="ngram")).check_drafts()
    with pytest.raises(ValueError, match="pipespec needs a draft model's probabilities"):
        JobConfig("m.gguf", ("d.gguf",), "pipespec",
                  spec=SpecOptions(draft_source="both")).check_drafts()


# --- exact under mpiexec -----------------------------------------------------------------------

def check_run(r: dict, reference: list[int], source: str) -> None:
    assert r["tokens"] == reference
    assert r["draft_source"] == source and r["partitions_free"] is True
    ngram, model = r["drafts"]["ngram"], r["drafts"]["model"]
    assert ngram["drafted"] > 0 and ngram["accepted"] > 0
    assert ngram["drafted"] + model["drafted"] == r["n_drafted"]
    if source == "ngram":
        assert model["drafted"] == 0


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.parametrize("source", ["ngram", "both"])
def test_smollm2_exact(smollm2, smol_self_draft, code_oracle, source):
    md = ["-md", str(smol_self_draft)] if source == "both" else []   # ngram: the default
    r = run(3, smollm2, CODE_PROMPT, "--strategy", "specpipe", "--layer-split", SPLIT, *md,
            n_predict=N_CODE)
    check_run(r, code_oracle, source)


TINY_PROMPT = "the number of people in the world " * 3


@pytest.mark.parametrize("source", ["ngram", "both"])
def test_tiny_model_exact(tiny_model, tiny_draft_aligned, source):
    md = ["-md", str(tiny_draft_aligned)] if source == "both" else []
    r = run(2, tiny_model, TINY_PROMPT, "--strategy", "specpipe", *md, n_predict=40)
    check_run(r, oracle(tiny_model, r["prompt_tokens"], 40), source)
