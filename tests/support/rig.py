"""Running a strategy in one process on the tiny set's real llama.cpp stages: the head's
slice and the worker slices loaded once (Rig), a generation through a Pipeline whose
transport a test chooses (SteppedTransport by default), and the checks every exact
generation passes (check_consistent)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from pipeinfer.config.job import JobConfig
from pipeinfer.config.run import RequestConfig
from pipeinfer.engine.drafting.drafter import Drafter
from pipeinfer.engine.head.generate import Drafting, driver_for
from pipeinfer.engine.head.pipeline import Pipeline
from pipeinfer.model.embedding import Embedder
from pipeinfer.model.sampling import Sampler, SamplingParams
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.schedule.generation import Generation, Request
from pipeinfer.schedule.options import SpecOptions
from pipeinfer.schedule.partition_pool import PartitionPool
from support.stepped_transport import SteppedTransport
from support.tiny_set import N_BATCH, N_CTX, N_PREDICT, PROMPT, TinySet


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

    def __init__(self, tiny: TinySet, draft=None, *,
                 spec: SpecOptions = SpecOptions(draft_thread=False), head_layers: int = 1,
                 n_workers: int = 2):
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
                         repack=False,   # (runs up to 7 tokens: the plain layout's exact size)
                         request=RequestConfig(PROMPT, n_predict=n_predict, sampling=sampling))

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


def run_inprocess(tiny: TinySet, strategy: str, draft, *,
                  spec: SpecOptions = SpecOptions(draft_thread=False), head_layers: int = 1,
                  n_workers: int = 2, **kw) -> Outcome:
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
