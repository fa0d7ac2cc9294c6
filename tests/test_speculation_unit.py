"""The head's speculation scheduler against real llama.cpp stages, in one process.

The `speculative` and `pipeinfer` strategies drive a Pipeline whose head evaluates the first
target layers (or none) and whose transport evaluates the rest. `SteppedTransport` models the
MPI worker pipeline faithfully: one FIFO of transactions per worker stage, every stage applies
them in issue order, a result returns only after the last stage computed it, and a
cancellation skips a run on every stage that has not started it yet (or aborts it mid-decode
through llama.cpp's abort callback). How far the pipeline advances per poll of the head is
scripted, so results arrive while the head speculates, and runs get cancelled part-way down
the pipeline.

Whatever the timing, drafts, branches and cancellations, greedy output must equal the
single-node greedy reference token for token. Property-based tests drive the scheduler with
scripted drafts (right, or wrong at chosen places, with chosen branches) and scripted pipeline
timing, or with the real drafter under random options. The bookkeeping pieces (run.py's
classification and token trees, the partition pool) have unit tests at the end.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pipeinfer.engine.drafting.drafter import Drafter
from pipeinfer.model.embedding import Embedder
from pipeinfer.schedule.generation import Generation, Request
from pipeinfer.engine.head.pipeline import Pipeline
from pipeinfer.model.partition import StageRange
from pipeinfer.schedule.partition_pool import PartitionPool
from pipeinfer.schedule.runs import Node, Run, RunState, tree_from_branches
from pipeinfer.config.job import JobConfig
from pipeinfer.config.run import RequestConfig
from pipeinfer.model.sampling import Sampler, SamplingParams
from pipeinfer.model.slicing import model_info, open_model, write_stage
from pipeinfer.model.stage import Stage, StageAborted, StageConfig
from pipeinfer.engine.head.generate import Drafting, driver_for
from pipeinfer.schedule.options import SpecOptions
from pipeinfer.model.tokenizer import Tokenizer
from pipeinfer.schedule.transaction import DecodeTx, KvOp, RunResult
from pipeinfer.engine.worker.core import apply_kv
from pipeinfer.engine.worker.local import LocalTransport

PROMPT = "the number of people in the world"
N_PREDICT = 32
N_CTX = 256
N_BATCH = 64
SPEC_STRATEGIES = ("speculative", "pipeinfer")


# --- models ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TinySet:
    """The tiny target, its drafts, its stage files and its greedy reference."""
    target: Path
    aligned: Path
    unrelated: Path
    n_layer: int
    n_vocab: int
    prompt: tuple[int, ...]
    reference: tuple[int, ...]          # greedy continuation of the prompt (128 tokens)
    stage_files: dict = field(default_factory=dict)   # (first, last, final) -> Path

    def stage_file(self, first: int, last: int, final: bool) -> Path:
        return self.stage_files[(first, last, final)]

    @property
    def full(self) -> tuple[int, ...]:
        """Prompt followed by the reference continuation."""
        return self.prompt + self.reference


def _fixture_or(request, name: str):
    """A conftest fixture if one with this name exists (and fits a module scope), else None."""
    try:
        return request.getfixturevalue(name)
    except (pytest.FixtureLookupError, Exception):  # missing, or a scope mismatch
        return None


def greedy_reference(model: Path, prompt: Sequence[int], n: int) -> list[int]:
    """Single-node greedy decoding: the whole model, one token per decode."""
    n_ctx = max(N_CTX, len(prompt) + n + 1)
    # (the layout of the in-process stages; the tiny models are F32, which is never repacked)
    config = StageConfig(n_ctx=n_ctx, n_batch=N_BATCH, n_seq_max=1, repack=False)
    with Stage(model, config, final=True, label="reference") as stage:
        out = stage.decode(list(range(len(prompt))), [(0,)] * len(prompt), tokens=list(prompt))
        tokens = [int(np.argmax(out[-1]))]
        while len(tokens) < n:
            pos = len(prompt) + len(tokens) - 1
            out = stage.decode([pos], [(0,)], tokens=[tokens[-1]])
            tokens.append(int(np.argmax(out[-1])))
    return tokens


_TINY_SETS: dict[str, TinySet] = {}   # one per pytest session (shared by importing modules)


def make_tiny_set(request, tmp_path_factory) -> TinySet:
    key = str(tmp_path_factory.getbasetemp())
    if key not in _TINY_SETS:
        _TINY_SETS[key] = _make_tiny_set(request, tmp_path_factory)
    return _TINY_SETS[key]


def _make_tiny_set(request, tmp_path_factory) -> TinySet:
    """The target is the tiny model's weights quantized to Q8_0, not the f32 `tiny_model`:
    llama.cpp's f32/f16 matrix products round differently for different batch sizes (a
    4-token batch gives logits up to ~4e-4 away from one-token decodes), so with f32 weights
    a verified speculative batch may legitimately flip a near-tie of the greedy reference
    (seen at token 151 of PROMPT with -np 2 -ps 0 -pa 0). Quantized kernels treat every row
    alike, so Q8_0 logits do not depend on the batch (test_target_is_batch_invariant), as
    with real quantized models. Drafts need no exactness: the f32 ones serve."""
    from pipeinfer.model.tinymodel import write_noisy_copy, write_tiny_llama, write_unrelated

    d = tmp_path_factory.mktemp("tiny-spec")
    target = write_tiny_llama(d / "tiny-q8.gguf", tensor_type=gguf.GGMLQuantizationType.Q8_0)
    aligned = _fixture_or(request, "tiny_draft_aligned")
    if not aligned:
        f32 = write_tiny_llama(d / "tiny-f32.gguf")
        aligned = write_noisy_copy(f32, d / "aligned.gguf", noise=0.05, seed=1)
    unrelated = _fixture_or(request, "tiny_draft_unrelated")
    unrelated = Path(unrelated) if unrelated else write_unrelated(d / "unrelated.gguf", 0)
    aligned = Path(aligned)
    reader = open_model(target)
    info = model_info(reader, target)
    files = {}
    # every contiguous slice, so tests can split the model any way they like
    for first in range(info.n_layer):
        for last in range(first + 1, info.n_layer + 1):
            final = last == info.n_layer
            path = d / f"stage-{first}-{last}.gguf"
            write_stage(reader, info, StageRange(0, first, last, final), path)
            files[(first, last, final)] = path
    tok = Tokenizer(target)
    prompt = tuple(tok.tokenize(PROMPT))
    tok.close()
    reference = greedy_reference(target, prompt, 128)
    return TinySet(target, aligned, unrelated, info.n_layer, info.n_vocab, prompt,
                   tuple(reference), files)


@pytest.fixture(scope="module")
def tiny(request, tmp_path_factory) -> TinySet:
    return make_tiny_set(request, tmp_path_factory)


def test_target_is_batch_invariant(tiny):
    """The premise of every exactness test here: a token's logits do not depend on how it
    is batched (alone, in a chain, or in a token tree over copied sequences)."""
    prompt = list(tiny.full[:20])
    config = StageConfig(n_ctx=N_CTX, n_batch=N_BATCH, n_seq_max=4)
    with Stage(tiny.target, config, final=True) as stage:
        single = []
        for i, t in enumerate(prompt):
            single.append(stage.decode([i], [(0,)], tokens=[t])[-1])
        stage.clear()
        chain = np.concatenate([stage.decode(list(range(i, i + 4)), [(0,)] * 4,
                                             tokens=prompt[i:i + 4]) for i in range(0, 20, 4)])
        stage.clear()
        for i in range(10):
            stage.decode([i], [(0,)], tokens=[prompt[i]])
        stage.seq_cp(0, 1)
        stage.seq_cp(0, 2)
        tree = stage.decode([10, 11, 11], [(1, 2), (1,), (2,)],
                            tokens=[prompt[10], prompt[11], (prompt[11] + 1) % tiny.n_vocab])
    assert np.array_equal(np.array(single), chain)
    assert np.array_equal(tree[0], single[10]) and np.array_equal(tree[1], single[11])


# --- an in-process worker pipeline with scripted timing ---------------------------------------

class SteppedTransport:
    """Worker stages in this process, each with its own FIFO of transactions, like MPI ranks.

    A poll of the head that finds no result may advance the pipeline. `script` (ints) decides
    per such poll: 0 = advance nothing (the head gets another chance to speculate), k >= 1 =
    let stage (k-1) mod n process its oldest transaction (or the first stage that has one).
    When the script is exhausted, `lag` idle polls are allowed between pipeline ticks (a tick
    lets every stage, last first, process one transaction, so a run moves one stage per tick).

    Cancellations reach every stage at once and concern a stage only for runs it has not
    processed yet (as in worker.py). A stage's oldest queued decode counts as the one it is
    computing now: with `abort`, a cancellation of that run aborts it mid-decode (the decode
    runs with llama.cpp's abort callback armed, so llama.cpp's and the stage's abort clean-up
    run); every other cancelled run is skipped when its turn comes. With `argmax` the last
    stage returns only each row's argmax, as workers do under greedy sampling.
    """

    def __init__(self, stages: list[Stage], lag: int = 0, script: Iterable[int] = (),
                 abort: bool = False, argmax: bool = False):
        self.stages = stages
        self.lag, self.abort, self.argmax = lag, abort, argmax
        self.script = iter(script)
        self.queues: list[deque] = [deque() for _ in stages]
        self.results: deque[RunResult] = deque()
        self.cancelled: list[dict[int, bool]] = [{} for _ in stages]  # run id -> abort
        self.done_through = [-1] * len(stages)
        self.idle = 0
        self.stats = [{"rank": i + 1, "computed": 0, "skipped": 0, "aborted": 0, "kv_ops": 0}
                      for i in range(len(stages))]
        self.cancel_msgs = 0

    # Transport protocol
    def send_decode(self, tx: DecodeTx, activations: np.ndarray) -> None:
        self.queues[0].append((tx, activations))

    def send_kv(self, ops: list[KvOp]) -> None:
        self.queues[0].append((None, list(ops)))

    def send_cancel(self, run_ids: list[int]) -> None:
        self.cancel_msgs += 1
        for s, queue in enumerate(self.queues):
            tx, x = queue[0] if queue else (None, None)
            computing = tx.run_id if tx is not None and x is not None else None
            for r in run_ids:
                if r > self.done_through[s]:
                    self.cancelled[s][r] = self.abort and r == computing

    def result_waiting(self) -> bool:
        # the head asks between draft steps: time passes for the pipeline as for a poll
        if not self.results:
            self._advance()
        return bool(self.results)

    def poll_result(self) -> RunResult | None:
        if not self.results:
            self._advance()
        return self.results.popleft() if self.results else None

    def shutdown(self) -> list[dict]:
        while any(self.queues):
            self.tick()
        return self.stats

    # pipeline mechanics
    def _advance(self) -> None:
        choice = next(self.script, None)
        if choice is None:
            if self.idle < self.lag:
                self.idle += 1
                return
            self.idle = 0
            self.tick()
        elif choice > 0:
            n = len(self.stages)
            order = [(choice - 1 + i) % n for i in range(n)]
            stage = next((s for s in order if self.queues[s]), None)
            if stage is not None:
                self.step(stage)

    def tick(self) -> None:
        for s in reversed(range(len(self.stages))):
            if self.queues[s]:
                self.step(s)

    def step(self, s: int) -> None:
        tx, payload = self.queues[s].popleft()
        last = s == len(self.stages) - 1
        if tx is None:
            apply_kv(self.stages[s], payload)
            self.stats[s]["kv_ops"] += len(payload)
            if not last:
                self.queues[s + 1].append((None, payload))
            return
        out = self._decode(s, tx, payload)
        self.done_through[s] = max(self.done_through[s], tx.run_id)
        self.cancelled[s].pop(tx.run_id, None)
        if last and out is not None and self.argmax:  # what a greedy worker sends
            self.results.append(RunResult(tx.run_id, None, np.argmax(out, axis=1)))
        elif last:
            self.results.append(RunResult(tx.run_id, out))
        else:
            self.queues[s + 1].append((tx, out))

    def _decode(self, s: int, tx: DecodeTx, x):
        stage, stats = self.stages[s], self.stats[s]
        marked = tx.run_id in self.cancelled[s]
        abort = self.cancelled[s].get(tx.run_id, False)
        if x is None or (marked and not abort):
            stats["skipped"] += 1
            return None
        if abort:
            stage.cancel(tx.run_id)
        try:
            out = stage.decode(tx.positions, tx.seq_ids, embd=x, logit_rows=tx.logit_rows,
                               run_id=tx.run_id)
        except StageAborted:
            stats["aborted"] += 1
            return None
        stats["computed"] += 1
        return out


# --- running a strategy in-process --------------------------------------------------------------

@dataclass
class Outcome:
    gen: Generation
    pool: PartitionPool
    stats: list[dict]
    transport: object
    seq0_max: list[int]   # last position in sequence 0 on every target stage, at the end

    @property
    def counters(self):
        return self.gen.counters

    def total(self, key: str) -> int:
        return sum(s.get(key, 0) for s in self.stats)


def split_layers(n_layer: int, head_layers: int, n_workers: int) -> list[tuple[int, int]]:
    """Layer ranges: the head's (possibly empty) then n_workers non-empty worker slices."""
    rest = n_layer - head_layers
    assert rest >= n_workers
    bounds = [head_layers + (rest * i) // n_workers for i in range(n_workers + 1)]
    return [(0, head_layers)] + list(zip(bounds[:-1], bounds[1:]))


class Rig:
    """Target stages (head slice + worker slices) and a draft, loaded once; `run` clears
    every KV cache and performs one generation. Use as a context manager."""

    def __init__(self, tiny: TinySet, draft=None, *, spec: SpecOptions = SpecOptions(draft_thread=False),
                 head_layers: int = 1, n_workers: int = 2):
        self.tiny, self.spec, self.head_layers = tiny, spec, head_layers
        self.cfg = self._config("pipeinfer", N_PREDICT, SamplingParams())
        pool = self.cfg.pool()
        config = StageConfig(n_ctx=self.cfg.kv_size, n_batch=N_BATCH, n_seq_max=pool.n_seq,
                             repack=self.cfg.repack_target)
        ranges = split_layers(tiny.n_layer, head_layers, n_workers)
        self.stages: list[Stage] = []
        self.head = None
        try:
            if head_layers:
                self.head = self._open(tiny.stage_file(0, head_layers, False), config, "head",
                                       False)
            self.workers = []
            for first, last in ranges[1:]:
                final = last == tiny.n_layer
                self.workers.append(self._open(tiny.stage_file(first, last, final), config,
                                               f"layers [{first},{last})", final))
            self.draft_stage = None
            self.draft = draft
            if isinstance(draft, (str, Path)):
                self.draft_stage = self._open(Path(draft), StageConfig(
                    n_ctx=self.cfg.kv_size, n_batch=N_BATCH, n_seq_max=spec.n_parallel),
                    "draft", True)
            self.embed = Embedder(tiny.target)
        except BaseException:
            self.close()
            raise

    def _open(self, path: Path, config: StageConfig, label: str, final: bool) -> Stage:
        stage = Stage(path, config, final=final, label=label)
        self.stages.append(stage)
        return stage

    def _config(self, strategy: str, n_predict: int, sampling: SamplingParams,
                n_ctx: int = N_CTX) -> JobConfig:
        return JobConfig(model=str(self.tiny.target), drafts=(str(self.tiny.aligned),),
                         strategy=strategy, n_ctx=n_ctx, n_batch=N_BATCH, spec=self.spec,
                         repack=False,
                         request=RequestConfig(PROMPT, n_predict=n_predict, sampling=sampling))   # (runs up to 7 tokens: the plain layout's exact size)

    def close(self) -> None:
        for stage in self.stages:
            stage.close()
        self.stages.clear()

    def __enter__(self) -> "Rig":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, strategy: str, *, sampling: SamplingParams = SamplingParams(),
            n_predict: int = N_PREDICT, transport=None,
            prompt: Sequence[int] | None = None, n_ctx: int = N_CTX,
            eog=None, draft=None, spec: SpecOptions | None = None) -> Outcome:
        """One generation. `transport`: a callable worker stages -> Transport (default: a
        SteppedTransport ticking on every poll). `draft` and `spec` override the rig's (a
        spec may not need more sequence ids than the rig's)."""
        for stage in self.stages:
            stage.clear()
        prompt = tuple(prompt or self.tiny.prompt)
        cfg = self._config(strategy, n_predict, sampling, min(n_ctx, N_CTX))
        if spec is not None:
            cfg = replace(cfg, spec=spec)
            assert cfg.pool().n_seq <= self.cfg.pool().n_seq and cfg.kv_size <= self.cfg.kv_size
        pool = cfg.pool()
        tr = (transport or (lambda stages: SteppedTransport(stages)))(self.workers)
        pipe = Pipeline(self.embed, self.head, tr)
        drafter = draft or (Drafter(self.draft_stage, N_BATCH) if self.draft_stage
                            else self.draft)
        gen = Generation(Request(prompt, n_predict, cfg.n_ctx, ignore_eos=eog is None),
                         eog or (lambda t: False))
        driver_for(strategy, pipe, gen, Sampler(sampling), cfg, Drafting(drafter), pool).run()
        stats = pipe.shutdown()
        seq0 = [s.seq_pos_max(0) for s in ([self.head] if self.head else []) + self.workers]
        return Outcome(gen, pool, stats, tr, seq0)


def run_inprocess(tiny: TinySet, strategy: str, draft, *, spec: SpecOptions = SpecOptions(draft_thread=False),
                  head_layers: int = 1, n_workers: int = 2, **kw) -> Outcome:
    """One generation with `strategy` on freshly loaded stages. `draft` is a GGUF path (a
    real Drafter is built) or an object with the Drafter interface."""
    with Rig(tiny, draft, spec=spec, head_layers=head_layers, n_workers=n_workers) as rig:
        return rig.run(strategy, **kw)


def check_consistent(out: Outcome, reference: Sequence[int], n_predict: int = N_PREDICT) -> None:
    c = out.counters
    assert out.gen.stop_reason == "length"
    assert out.gen.tokens == list(reference[:n_predict])
    assert out.pool.all_free, f"{out.pool.size - out.pool.n_free} partition(s) never returned"
    assert c.runs_started >= c.runs_speculative
    # accepted guesses come from verified runs only
    assert 0 <= c.n_unverified <= c.n_drafted
    assert 0 <= c.n_accepted <= c.n_drafted - c.n_unverified
    if c.n_drafted > c.n_unverified:
        assert c.accept_rate <= c.verified_accept_rate <= 1
    assert c.runs_cancelled_superfluous + c.runs_cancelled_invalidated <= c.runs_started
    # sequence 0 only ever holds accepted tokens, up to (not including) the pending one, and
    # at the end all of them (a serving slot keeps them for the next turn: prompt_cache.py)
    n_prompt = len(out.gen.request.prompt)
    assert all(m == n_prompt + n_predict - 2 for m in out.seq0_max), out.seq0_max
    # every run was computed, skipped or aborted once on every worker stage
    for s in out.stats:
        assert s["computed"] + s["skipped"] + s["aborted"] == c.runs_started, (s, c)


# --- 1. real drafts, timing from the transport ------------------------------------------------

DRAFTS = ("aligned", "unrelated")


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
@pytest.mark.parametrize("delay", [0, 1, 2, 3])
def test_local_transport_exact(tiny, strategy, draft, delay):
    """The stock LocalTransport (whole worker pipeline per step) at every delay."""
    out = run_inprocess(tiny, strategy, getattr(tiny, draft),
                        transport=lambda stages: LocalTransport(stages, delay=delay))
    check_consistent(out, tiny.reference)
    if strategy == "speculative":
        assert out.counters.runs_speculative > 0


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
@pytest.mark.parametrize("head_layers", [0, 1])
@pytest.mark.parametrize("lag", [0, 1, 2, 3])
@pytest.mark.parametrize("abort", [False, True], ids=["skip", "abort"])
def test_stepped_pipeline_exact(tiny, strategy, draft, head_layers, lag, abort):
    """Results arrive while the head speculates: `lag` idle polls per pipeline tick. (The
    abort variants also return argmaxes only, as greedy workers do.)"""
    spec = SpecOptions(draft_thread=False, n_parallel=2, p_split=0.1)
    out = run_inprocess(tiny, strategy, getattr(tiny, draft), spec=spec,
                        head_layers=head_layers,
                        transport=lambda stages: SteppedTransport(stages, lag=lag, abort=abort,
                                                                  argmax=abort))
    check_consistent(out, tiny.reference)
    c = out.counters
    if strategy == "speculative":
        assert c.runs_speculative > 0
    else:
        assert c.runs_speculative > 0
        if draft == "unrelated":
            assert c.runs_cancelled_invalidated > 0
            assert out.total("skipped") + out.total("aborted") > 0
            if abort:
                assert out.total("aborted") > 0


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("head_layers", [0, 1])
@pytest.mark.parametrize("transport", ["local-0", "local-2", "stepped-1", "stepped-3-abort"])
@pytest.mark.parametrize("continuous", [True, False])
def test_draft_thread_exact(tiny, draft, head_layers, transport, continuous):
    """pipeinfer with the draft model on a thread of its own (the CLI's default): results
    are absorbed while micro-batches are drafted, jobs go stale or are rebased onto the
    newest speculation; the timing is the threads', the output must not depend on it."""
    kind, lag, *abort = transport.split("-")
    make = ((lambda st: LocalTransport(st, delay=int(lag))) if kind == "local" else
            (lambda st: SteppedTransport(st, lag=int(lag), abort=bool(abort),
                                         argmax=bool(abort))))
    spec = SpecOptions(draft_thread=True, continuous=continuous, n_parallel=2, p_split=0.1)
    out = run_inprocess(tiny, "pipeinfer", getattr(tiny, draft), spec=spec,
                        head_layers=head_layers, transport=make)
    check_consistent(out, tiny.reference)


@pytest.mark.parametrize("n_predict", [1, 2, 5])
def test_draft_thread_few_tokens(tiny, n_predict):
    """Generation over while the thread may still be warming up or drafting: it is stopped
    and joined, and the output is exact."""
    out = run_inprocess(tiny, "pipeinfer", tiny.aligned, spec=SpecOptions(draft_thread=True),
                        n_predict=n_predict, transport=lambda st: LocalTransport(st, delay=1))
    check_consistent(out, tiny.reference, n_predict)


def test_draft_thread_speculates(tiny):
    """With a pipeline slower than a draft step, threaded drafting starts speculative runs
    whose tokens are accepted (a slow transport: every poll sleeps)."""
    class Slow(LocalTransport):
        def poll_result(self):
            time.sleep(0.004)
            return super().poll_result()

    out = run_inprocess(tiny, "pipeinfer", tiny.aligned, spec=SpecOptions(draft_thread=True),
                        transport=lambda st: Slow(st, delay=2))
    check_consistent(out, tiny.reference)
    assert out.counters.runs_speculative > 0 and out.counters.n_accepted > 0


@pytest.mark.parametrize("continuous,cancel", [(False, True), (True, False), (False, False)])
def test_pipeinfer_ablations_exact(tiny, continuous, cancel):
    spec = SpecOptions(draft_thread=False, continuous=continuous, cancel=cancel)
    for draft in (tiny.aligned, tiny.unrelated):
        out = run_inprocess(tiny, "pipeinfer", draft, spec=spec,
                            transport=lambda stages: SteppedTransport(stages, lag=2))
        check_consistent(out, tiny.reference)
        if not cancel:
            assert out.total("skipped") == out.total("aborted") == 0
            assert out.transport.cancel_msgs == 0
        if not continuous:
            assert out.counters.runs_speculative > 0


def test_pipeinfer_saves_work_in_process(tiny):
    """Cancelling invalidated runs skips stage computations that --no-cancel performs."""
    spec = SpecOptions(draft_thread=False, p_accept=0.0, p_recovery=0.0, p_decay=0.0, max_runs=4)
    runs = {}
    for cancel in (True, False):
        runs[cancel] = run_inprocess(
            tiny, "pipeinfer", tiny.unrelated, spec=replace(spec, cancel=cancel),
            transport=lambda stages: SteppedTransport(stages, lag=3))
        check_consistent(runs[cancel], tiny.reference)
    with_cancel, without = runs[True], runs[False]
    # the scripted timing makes both runs schedule the same runs
    assert with_cancel.counters.runs_started == without.counters.runs_started
    assert with_cancel.total("skipped") > 0
    assert with_cancel.total("computed") < without.total("computed")


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_end_of_generation_stops_exactly(tiny, strategy):
    """Tokens after an end-of-generation token are never accepted, even when a verified
    draft continued past it."""
    k = next(i for i in range(6, len(tiny.reference)) if tiny.reference[i] not in
             tiny.reference[:i])
    eog = tiny.reference[k]
    for draft in (tiny.aligned, tiny.unrelated):
        out = run_inprocess(tiny, strategy, draft, eog=lambda t: t == eog,
                            transport=lambda stages: SteppedTransport(stages, lag=2))
        assert out.gen.stop_reason == "eos"
        assert out.gen.tokens == list(tiny.reference[:k + 1])
        assert out.pool.all_free


@pytest.mark.parametrize("n_predict", [1, 2, 3])
@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_few_tokens(tiny, strategy, n_predict):
    out = run_inprocess(tiny, strategy, tiny.aligned, n_predict=n_predict,
                        transport=lambda stages: SteppedTransport(stages, lag=1))
    check_consistent(out, tiny.reference, n_predict)


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_prompt_longer_than_batch(tiny, strategy):
    """A prompt prefilled in several chunks (n_batch 64); greedy continuations of a prefix
    of the reference are the rest of the reference."""
    n_prompt = N_BATCH + 20
    prompt = tiny.full[:n_prompt]
    out = run_inprocess(tiny, strategy, tiny.aligned, prompt=prompt, n_predict=30,
                        transport=lambda stages: SteppedTransport(stages, lag=2))
    check_consistent(out, tiny.full[n_prompt:], 30)


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_stops_at_context_limit(tiny, strategy):
    n_ctx = len(tiny.prompt) + 13
    out = run_inprocess(tiny, strategy, tiny.aligned, n_ctx=n_ctx, n_predict=100,
                        spec=SpecOptions(draft_thread=False, p_accept=0.0, n_parallel=2, p_split=0.0,
                                         kv_size=4 * N_CTX),
                        transport=lambda stages: SteppedTransport(stages, lag=2))
    assert out.gen.stop_reason == "context"
    assert out.gen.tokens == list(tiny.reference[:13])
    assert out.pool.all_free


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_stops_cleanly_when_kv_cache_is_full(tiny, strategy):
    """Cells of rejected drafts are not reused: a small cache fills up, and generation stops
    early with a reason, its tokens still a prefix of the reference."""
    spec = SpecOptions(draft_thread=False, kv_size=len(tiny.prompt) + 40, p_accept=0.0, n_parallel=2,
                       p_split=0.0)
    # a slow pipeline (lag 6), so that pipeinfer completes its drafts
    out = run_inprocess(tiny, strategy, tiny.unrelated, spec=spec, n_predict=100,
                        transport=lambda stages: SteppedTransport(stages, lag=6))
    tokens = out.gen.tokens
    assert out.gen.stop_reason == "kv-cache"
    assert 0 < len(tokens) < 40 and tokens == list(tiny.reference[:len(tokens)])
    assert out.pool.all_free


@pytest.mark.parametrize("strategy", SPEC_STRATEGIES)
def test_stops_cleanly_when_kv_cache_is_full_single_branch(tiny, strategy):
    spec = SpecOptions(draft_thread=False, kv_size=len(tiny.prompt) + 40, p_accept=0.0)
    out = run_inprocess(tiny, strategy, tiny.unrelated, spec=spec, n_predict=100,
                        transport=lambda stages: SteppedTransport(stages, lag=2))
    tokens = out.gen.tokens
    assert out.gen.stop_reason == "kv-cache"
    assert 0 < len(tokens) < 40 and tokens == list(tiny.reference[:len(tokens)])
    assert out.pool.all_free


def test_local_transport_delay_lets_pipeinfer_speculate(tiny):
    out = run_inprocess(tiny, "pipeinfer", tiny.aligned,
                        transport=lambda stages: LocalTransport(stages, delay=2))
    check_consistent(out, tiny.reference)
    assert out.counters.runs_speculative > 0


# --- 2. property-based: scripted drafts and pipeline timing -----------------------------------

@dataclass(frozen=True)
class BranchPlan:
    length: int               # tokens (clamped to the draft budget)
    wrong_at: int | None      # index of the first wrong token, None: all correct
    offset: int               # how a wrong token differs from the right one


@dataclass(frozen=True)
class ForkPlan:
    parent: int               # branch to fork from (mod existing branches)
    depth: int                # fork depth (mod the parent's length)
    right_first: bool         # the fork's first token is the right one (if still free)
    branch: BranchPlan        # the fork's continuation after its first token


@dataclass(frozen=True)
class DraftPlan:
    give_up: bool             # the draft is "not confident": no tokens
    main: BranchPlan
    forks: tuple[ForkPlan, ...]
    heed_stop: bool = True    # end early when told a result is waiting (as Drafter does)


branch_plans = st.builds(BranchPlan, st.integers(1, 5),
                         st.one_of(st.none(), st.integers(0, 4)), st.integers(0, 10_000))
draft_plans = st.builds(
    DraftPlan, st.sampled_from([False, False, False, True]), branch_plans,
    st.lists(st.builds(ForkPlan, st.integers(0, 2), st.integers(0, 4), st.booleans(),
                       branch_plans), max_size=2).map(tuple),
    st.booleans())


class ScriptedDraft:
    """A draft with the Drafter interface whose guesses follow a script: per call, the right
    continuation (the greedy reference) or tokens going wrong at a chosen index, with forks
    at chosen places. Branches keep the real drafter's shape: branch 0 first, pairwise
    distinct, none a prefix of another."""

    def __init__(self, full_reference: Sequence[int], n_vocab: int, plans: Sequence[DraftPlan]):
        self.ref = list(full_reference)
        self.n_vocab = n_vocab
        self.plans = list(plans)
        self.calls = 0

    def _next(self, seq: Sequence[int]) -> int:
        """The target's greedy token after `seq` (made up, deterministically, once `seq` has
        left the reference)."""
        n = len(seq)
        if n < len(self.ref) and list(seq) == self.ref[:n]:
            return self.ref[n]
        return (sum(seq) * 31 + 7 * n) % self.n_vocab

    def _wrong(self, right: int, offset: int) -> int:
        return (right + 1 + offset % (self.n_vocab - 1)) % self.n_vocab

    def _extend(self, seq: list[int], plan: BranchPlan, count: int) -> list[int]:
        out: list[int] = []
        for i in range(count):
            token = self._next(seq + out)
            if plan.wrong_at == i:
                token = self._wrong(token, plan.offset)
            out.append(token)
        return out

    def prepare(self, context, max_tokens=None) -> None:
        """Nothing to warm up: the script needs no model."""

    def draft(self, context, params, cutoff, max_tokens=None, should_stop=None, room=None):
        limit = params.max_tokens if max_tokens is None else max_tokens
        plan = self.plans[self.calls % len(self.plans)]
        self.calls += 1
        if limit <= 0 or plan.give_up:
            return [], []
        context = list(context)
        main = self._extend(context, plan.main, min(limit, plan.main.length))
        # like Drafter: end early with the tokens so far when asked to between draft steps
        # (a result is waiting)
        for i in range(len(main) - 1):
            if plan.heed_stop and should_stop is not None and should_stop():
                return [main[:i + 1]], [1.0] * (i + 1)
        branches = [main]
        for fork in plan.forks[:params.n_parallel - 1]:
            parent = branches[fork.parent % len(branches)]
            depth = fork.depth % len(parent)
            prefix = parent[:depth]
            taken = {b[depth] for b in branches if len(b) > depth and b[:depth] == prefix}
            right = self._next(context + prefix)
            first, k = right, 0
            if not fork.right_first:
                first = self._wrong(right, fork.branch.offset)
            while first in taken:
                k += 1
                first = self._wrong(right, fork.branch.offset + k)
            tokens = prefix + [first]
            more = min(limit, depth + fork.branch.length) - len(tokens)
            branches.append(tokens + self._extend(context + tokens, fork.branch, max(0, more)))
        return branches, [1.0] * len(main)


def _prop_settings(**kw):
    # SPEC_PROPERTY_EXAMPLES=500 for a longer bug hunt
    return settings(max_examples=int(os.environ.get("SPEC_PROPERTY_EXAMPLES", 25)), deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture], **kw)


@_prop_settings()
@given(strategy=st.sampled_from(SPEC_STRATEGIES),
       plans=st.lists(draft_plans, min_size=1, max_size=12),
       schedule=st.lists(st.sampled_from([0, 0, 1, 2, 3]), max_size=80),
       lag=st.sampled_from([0, 1, 2, 4, 8, 12]),
       abort=st.booleans(),
       head_layers=st.integers(0, 1),
       n_parallel=st.integers(1, 3),
       draft_max=st.integers(1, 4),
       max_runs=st.integers(2, 6),
       partitions=st.integers(1, 4),
       continuous=st.booleans(),
       cancel=st.booleans(),
       argmax=st.booleans())
def test_scheduler_property_exact(tiny, strategy, plans, schedule, lag, abort, head_layers,
                                  n_parallel, draft_max, max_runs, partitions, continuous,
                                  cancel, argmax):
    spec = SpecOptions(draft_thread=False, draft=draft_max, n_parallel=n_parallel, max_runs=max_runs,
                       partitions=partitions, continuous=continuous, cancel=cancel,
                       p_accept=0.0, p_recovery=0.0, p_decay=0.0)
    drafter = ScriptedDraft(tiny.full, tiny.n_vocab, plans)
    n_predict = 20
    out = run_inprocess(
        tiny, strategy, drafter, spec=spec, head_layers=head_layers, n_predict=n_predict,
        transport=lambda stages: SteppedTransport(stages, lag=lag, script=schedule, abort=abort,
                                                  argmax=argmax))
    check_consistent(out, tiny.reference, n_predict)
    c = out.counters
    for name, hit in (("drafted tokens accepted", c.n_accepted > 0),
                      ("runs cancelled as invalidated", c.runs_cancelled_invalidated > 0),
                      ("runs cancelled as superfluous", c.runs_cancelled_superfluous > 0),
                      ("stage decodes skipped", out.total("skipped") > 0),
                      ("stage decodes aborted", out.total("aborted") > 0)):
        event(f"{strategy}: {name}: {hit}")


@_prop_settings()
@given(strategy=st.sampled_from(SPEC_STRATEGIES),
       draft=st.sampled_from(DRAFTS),
       schedule=st.lists(st.integers(0, 3), max_size=60),
       lag=st.integers(0, 3),
       abort=st.booleans(),
       head_layers=st.integers(0, 1),
       n_parallel=st.integers(1, 3),
       draft_max=st.integers(1, 4),
       p_accept=st.sampled_from([0.0, 0.05, 0.3, 0.6]),
       p_split=st.sampled_from([0.0, 0.05, 0.3]),
       p_recovery=st.sampled_from([0.0, 0.05, 0.2]),
       p_decay=st.sampled_from([0.0, 0.01, 0.1]),
       max_runs=st.integers(2, 6),
       partitions=st.integers(1, 4),
       continuous=st.booleans(),
       cancel=st.booleans(),
       draft_thread=st.booleans())
def test_real_drafter_property_exact(tiny, strategy, draft, schedule, lag, abort, head_layers,
                                     n_parallel, draft_max, p_accept, p_split, p_recovery,
                                     p_decay, max_runs, partitions, continuous, cancel,
                                     draft_thread):
    """The real Drafter (confidence cutoff, branching, adaptive p_adjust) under random
    pipeline timing and options (pipeinfer: drafting on the head's thread or its own)."""
    spec = SpecOptions(draft=draft_max, p_accept=p_accept, p_split=p_split,
                       n_parallel=n_parallel, p_recovery=p_recovery, p_decay=p_decay,
                       continuous=continuous, cancel=cancel, max_runs=max_runs,
                       partitions=partitions, draft_thread=draft_thread)
    n_predict = 20
    out = run_inprocess(
        tiny, strategy, getattr(tiny, draft), spec=spec, head_layers=head_layers,
        n_predict=n_predict,
        transport=lambda stages: SteppedTransport(stages, lag=lag, script=schedule, abort=abort))
    check_consistent(out, tiny.reference, n_predict)


PERFECT = [DraftPlan(False, BranchPlan(5, None, 0), ())]    # always the right tokens
USELESS = [DraftPlan(False, BranchPlan(5, 0, 3), ())]       # always wrong from the first


@pytest.mark.parametrize("lag", [2, 3, 5])   # slow enough for a micro-batch to be drafted
def test_counters_perfect_and_useless_drafts(tiny, lag):
    # (the guard off: useless drafts would pause speculation; tests/test_guard.py)
    spec = SpecOptions(draft_thread=False, p_accept=0.0, p_recovery=0.0, p_decay=0.0, guard_accept=0.0)
    n = 40

    def go(strategy, plans):
        out = run_inprocess(tiny, strategy, ScriptedDraft(tiny.full, tiny.n_vocab, plans),
                            spec=spec, n_predict=n,
                            transport=lambda stages: SteppedTransport(stages, lag=lag))
        check_consistent(out, tiny.reference, n)
        return out.counters

    c = go("speculative", PERFECT)   # every drafted token verified: 5 tokens per run
    assert c.n_accepted == c.n_drafted == 4 * c.runs_speculative
    assert c.n_unverified == 0 and c.verified_accept_rate == c.accept_rate == 1
    assert c.runs_speculative == -(-(n - 1) // 5) and c.runs_started == c.runs_speculative + 1
    c = go("pipeinfer", PERFECT)     # every token after the first was a verified draft ...
    assert c.n_accepted == n - 1
    # ... and every verified one was accepted; only runs still in flight at the end, or cut
    # short by it, were not verified
    assert c.n_drafted - c.n_unverified - c.n_accepted <= spec.draft
    assert c.n_unverified <= spec.max_runs * spec.draft
    # ... so after the prefill and the first token's run, every run was speculative
    assert c.runs_started - c.runs_speculative == 2
    assert c.runs_cancelled_invalidated == c.runs_cancelled_superfluous == 0
    c = go("speculative", USELESS)
    assert c.n_accepted == 0 and c.n_drafted > 0 and c.runs_speculative == n - 1
    assert c.n_unverified == 0 and c.verified_accept_rate == c.accept_rate == 0
    c = go("pipeinfer", USELESS)
    assert c.n_accepted == 0 and c.n_drafted > 0
    # every speculative run was invalidated by the result before it (its first guess was
    # wrong) and dropped unverified: verification never saw a drafted token
    assert c.n_unverified == c.n_drafted and c.verified_accept_rate is None
    # every generated token after the first needed its own non-speculative run
    assert c.runs_started - c.runs_speculative == n
    assert c.runs_cancelled_invalidated > 0


# --- 3. run.py and partition_pool.py ----------------------------------------------------------

def _run(base: int, context: Sequence[int], branches, seqs=(1, 2, 3), speculative=True) -> Run:
    nodes, main = tree_from_branches(branches, list(seqs)[:len(branches)])
    return Run(0, base, tuple(context), nodes, speculative, main_path=main)


class TestClassify:
    ctx = (10, 11, 12)

    def test_valid_when_tree_continues_accepted(self):
        run = _run(3, self.ctx, [[20, 21, 22]])
        # pending token 20 at position 3: covered
        assert run.classify([10, 11, 12, 20]) == RunState.VALID
        assert run.classify([10, 11, 12, 20, 21]) == RunState.VALID
        assert run.classify([10, 11, 12, 20, 21, 22]) == RunState.VALID

    def test_valid_when_ahead_of_accepted(self):
        run = _run(5, self.ctx + (20, 21), [[22, 23]])
        assert run.classify([10, 11, 12, 20]) == RunState.VALID
        assert run.classify([10, 11, 12]) == RunState.VALID

    def test_invalidated_by_context(self):
        run = _run(5, self.ctx + (20, 21), [[22, 23]])
        assert run.classify([10, 11, 12, 99]) == RunState.INVALIDATED
        assert run.classify([10, 11, 13]) == RunState.INVALIDATED

    def test_invalidated_by_tree(self):
        run = _run(3, self.ctx, [[20, 21, 22], [20, 30]])
        assert run.classify([10, 11, 12, 20, 30]) == RunState.VALID   # second branch
        assert run.classify([10, 11, 12, 20, 31]) == RunState.INVALIDATED
        assert run.classify([10, 11, 12, 21]) == RunState.INVALIDATED

    def test_superfluous(self):
        run = _run(3, self.ctx, [[20, 21]])
        # positions 3, 4 accepted and the pending token sits at position 5: nothing to decide
        assert run.classify([10, 11, 12, 20, 21, 7]) == RunState.SUPERFLUOUS
        # its last node is the pending token: still valid (it gives the next token's logits)
        assert run.classify([10, 11, 12, 20, 21]) == RunState.VALID

    def test_superfluous_non_speculative(self):
        run = Run(0, 3, self.ctx, [Node(20, -1, 0, (0,))], speculative=False, main_path=[0])
        assert run.classify([10, 11, 12, 20]) == RunState.VALID
        assert run.classify([10, 11, 12, 20, 21]) == RunState.SUPERFLUOUS


class TestPathTo:
    def test_follows_accepted_tokens(self):
        run = _run(2, (1, 2), [[5, 6, 7], [5, 8], [9]])
        assert run.nodes[run.path_to([1, 2, 5])].token == 5
        node = run.path_to([1, 2, 5, 8])
        assert run.nodes[node].token == 8 and run.nodes[node].depth == 1
        node = run.path_to([1, 2, 5, 6, 7])
        assert run.nodes[node].token == 7 and run.nodes[node].depth == 2
        assert run.nodes[run.path_to([1, 2, 9])].token == 9

    def test_none_when_leaving_or_short(self):
        run = _run(2, (1, 2), [[5, 6, 7]])
        assert run.path_to([1, 2, 4]) is None
        assert run.path_to([1, 2, 5, 7]) is None
        assert run.path_to([1, 2]) is None
        assert run.path_to([1]) is None

    def test_accepted_beyond_tree(self):
        run = _run(2, (1, 2), [[5, 6]])
        assert run.path_to([1, 2, 5, 6, 9]) is None


branch_lists = st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), min_size=1,
                        max_size=4)


class TestTreeFromBranches:
    def test_example(self):
        nodes, main = tree_from_branches([[1, 2, 3], [1, 4], [5]], [7, 8, 9])
        assert [(n.token, n.parent, n.depth, n.seqs) for n in nodes] == [
            (1, -1, 0, (7, 8)), (5, -1, 0, (9,)), (2, 0, 1, (7,)), (4, 0, 1, (8,)),
            (3, 2, 2, (7,))]
        assert main == [0, 2, 4]

    def test_empty(self):
        assert tree_from_branches([], []) == ([], [])

    @given(branch_lists)
    def test_properties(self, branches):
        seqs = list(range(1, len(branches) + 1))
        nodes, main = tree_from_branches(branches, seqs)
        prefixes = {tuple(b[:d + 1]) for b in branches for d in range(len(b))}
        assert len(nodes) == len(prefixes)
        for i, node in enumerate(nodes):
            if node.parent == -1:
                assert node.depth == 0
            else:
                assert node.parent < i                       # parents first
                parent = nodes[node.parent]
                assert node.depth == parent.depth + 1
                assert set(node.seqs) <= set(parent.seqs)    # sequence sets nest
        assert [n.depth for n in nodes] == sorted(n.depth for n in nodes)
        # branch 0 is the main path, and every branch is a root-to-node path with its seq
        assert [nodes[i].token for i in main] == list(branches[0])
        for b, branch in enumerate(branches):
            node, path = -1, []
            for token in branch:
                node = next(i for i, n in enumerate(nodes)
                            if n.parent == node and n.token == token)
                path.append(node)
                assert seqs[b] in nodes[node].seqs
            if b == 0:
                assert path == main
        # a node's seqs are exactly the branches through it
        for node in nodes:
            for s in node.seqs:
                assert s in seqs

    @given(branch_lists)
    def test_run_views(self, branches):
        nodes, main = tree_from_branches(branches, list(range(1, len(branches) + 1)))
        run = Run(3, 4, (0, 1, 2, 3), nodes, True, main_path=main)
        assert run.max_pos == 4 + max(len(b) for b in branches) - 1
        tx = run.tx()
        assert tx.positions == tuple(4 + n.depth for n in nodes)
        assert tx.seq_ids == tuple(n.seqs for n in nodes)
        assert all(tx.logit_rows) and tx.speculative
        for branch in branches:
            node = run.path_to([0, 1, 2, 3] + list(branch))
            assert node is not None and run.nodes[node].depth == len(branch) - 1


class TestPartitionPool:
    def test_fifo_order(self):
        pool = PartitionPool(3, 2)
        a, b, c = pool.take(), pool.take(), pool.take()
        assert (a, b, c) == ((1, 2), (3, 4), (5, 6))
        assert pool.take() is None and pool.n_free == 0
        pool.give_back(b)
        pool.give_back(a)
        assert pool.take() == b          # oldest returned first
        pool.give_back(c)
        assert pool.take() == a
        assert pool.take() == c

    def test_sequence_ids(self):
        pool = PartitionPool(4, 3)
        assert pool.graveyard == 13 and pool.n_seq == 14
        ids = [s for _ in range(4) for s in pool.take()]
        assert ids == list(range(1, 13))

    def test_double_return(self):
        pool = PartitionPool(2, 1)
        p = pool.take()
        pool.give_back(p)
        with pytest.raises(RuntimeError, match="twice"):
            pool.give_back(p)
        with pytest.raises(RuntimeError, match="twice"):
            pool.give_back(pool._free[0])

    def test_all_free(self):
        pool = PartitionPool(2, 1)
        assert pool.all_free
        p = pool.take()
        assert not pool.all_free
        pool.give_back(p)
        assert pool.all_free

    @pytest.mark.parametrize("n,w", [(0, 1), (1, 0)])
    def test_invalid(self, n, w):
        with pytest.raises(ValueError):
            PartitionPool(n, w)

    @given(st.lists(st.booleans(), max_size=60), st.integers(1, 5))
    def test_fifo_model(self, ops, n):
        pool = PartitionPool(n, 1)
        free = deque((i,) for i in range(1, n + 1))
        held: deque = deque()
        for take in ops:
            if take:
                got = pool.take()
                assert got == (free.popleft() if free else None)
                if got is not None:
                    held.append(got)
            elif held:
                p = held.popleft()
                pool.give_back(p)
                free.append(p)
            assert pool.n_free == len(free)
