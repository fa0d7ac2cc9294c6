"""What the simulator (simulate.py) is asked and what it answers: the generation to simulate
(SimConfig), the settings it refuses (check), and the predicted figures (SimResult).

The figures are those a user waits for: TTFT, the time from the request to the first
generated token, which is the prompt's evaluation (prefill, in chunks through the pipeline)
and the first token's sampling from its last row; the prompt's tokens per second over that
time; the generation speed and inter-token latency after the first token. `run --json`'s
`ttft_s` (schedule/counters.py Timeline.ttft_s) is another figure: the first token to the
second, here `second_token_s`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import strategies
from ..config.job import PREFILL_CHUNK, PREFILL_TAIL, JobConfig
from ..schedule.speculation import prompt_runs
from ..schedule.options import EXACT_RUN_REPACKED, SpecOptions
from .cost import CostError, Pipeline, costs_step

N_CTX = 2048          # the context when prompt and generation fit it
CTX_MARGIN = 64       # beyond them: room for the runs speculated past the last token


class SimulationError(CostError):
    """Settings the simulator cannot run; the message says which."""


@dataclass(frozen=True)
class SimConfig:
    """One generation: `prompt_len` prompt tokens evaluated in batches ending at multiples of
    `prefill_chunk` (at most `n_batch`), its last partial chunk in runs of `prefill_tail`,
    then `n_predict` tokens of `strategy`."""
    strategy: str
    n_predict: int = 64
    prompt_len: int = 32
    accept_rate: float = 0.8
    seed: int = 0
    spec: SpecOptions = SpecOptions()
    max_run: int = EXACT_RUN_REPACKED
    n_ctx: int = 0            # 0: N_CTX, or what the prompt and the generation need
    idle_sleep: bool = True   # model the idle ranks' polling sleeps (False: an ideal pipeline)
    prefill_chunk: int = PREFILL_CHUNK
    prefill_tail: int = PREFILL_TAIL
    n_batch: int = JobConfig.n_batch

    @property
    def chunk(self) -> int:
        """The prompt's batch size (JobConfig.chunk)."""
        return min(self.prefill_chunk, self.n_batch)

    @property
    def context(self) -> int:
        """The context size: no cost depends on it, so it is what the generation needs."""
        return self.n_ctx or max(N_CTX, self.prompt_len + self.n_predict + CTX_MARGIN)

    @property
    def largest_prompt_batch(self) -> int:
        return max(len(run) for run in prompt_runs(range(self.prompt_len), self.chunk,
                                                   self.prefill_tail))


@dataclass
class SimResult:
    """The predicted figures of one generation (seconds, tokens per second); see the module's
    docstring for what each means."""
    speed_tps: float
    ttft_s: float
    itl_s: float
    second_token_s: float
    n_generated: int
    accept_rate: float | None
    prompt_len: int
    busy_s: list[float]
    counters: dict = field(default_factory=dict)

    @property
    def prefill_tps(self) -> float:
        """The prompt's tokens per second of TTFT."""
        return self.prompt_len / self.ttft_s if self.ttft_s > 0 else float("inf")

    def to_dict(self) -> dict:
        return {"speed_tps": round(self.speed_tps, 4), "ttft_s": round(self.ttft_s, 6),
                "prefill_tps": round(self.prefill_tps, 3), "prompt_len": self.prompt_len,
                "itl_s": round(self.itl_s, 6), "second_token_s": round(self.second_token_s, 6),
                "n_generated": self.n_generated,
                "accept_rate": None if self.accept_rate is None else round(self.accept_rate, 4),
                "busy_s": [round(b, 6) for b in self.busy_s], **self.counters}


def check(pipe: Pipeline, counts: list[int], cfg: SimConfig) -> None:
    """SimulationError for settings that cannot give a result."""
    known = strategies.names(simulated=True)
    if cfg.strategy not in known:
        raise SimulationError(f"simulate supports {', '.join(known)}, not {cfg.strategy!r}")
    if len(counts) != len(pipe.nodes):
        raise SimulationError(f"the split has {len(counts)} shares for {len(pipe.nodes)} nodes")
    if sum(counts) != pipe.model.n_layer or any(c < 0 for c in counts):
        raise SimulationError(f"the split places {sum(counts)} layers, the model has "
                              f"{pipe.model.n_layer}")
    if cfg.n_predict < 2:
        raise SimulationError("-n must be at least 2 (speed counts the tokens after the first)")
    if cfg.prompt_len < 1 or cfg.chunk < 1:
        raise SimulationError("the prompt and its chunks need at least one token")
    if not 0 <= cfg.accept_rate <= 1:
        raise SimulationError(f"--accept-rate {cfg.accept_rate} is not between 0 and 1")
    if strategies.get(cfg.strategy).speculates and pipe.nodes[0].draft_ms <= 0:
        raise SimulationError(f"strategy {cfg.strategy} needs the draft model's time per token "
                              "on the head (a profile measured with -md, or -md)")
    for rank, node in enumerate(pipe.nodes):
        if counts[rank] and not any(ms > 0 for ms in node.layer_ms.values()):
            raise SimulationError(f"node {rank} ({node.name}) has no positive layer time")
    if pipe.draft_tokens:
        raise SimulationError("simulate models the draft itself: give a Pipeline with "
                              "draft_tokens=0")
    check_prompt_steps(pipe, counts, cfg)


def check_prompt_steps(pipe: Pipeline, counts: list[int], cfg: SimConfig) -> None:
    """SimulationError if a node's figures do not reach the prompt's batches: a profile
    without the prompt chunk's step would cost them by extending the small steps' slope."""
    b = cfg.largest_prompt_batch
    for rank, node in enumerate(pipe.nodes):
        if counts[rank] and not costs_step(node.layer_ms, b):
            largest = max(node.layer_ms)
            raise SimulationError(
                f"node {rank} ({node.name}) has layer times for steps of up to {largest} "
                f"tokens, not for the prompt's batches of {b}: measure the profile again "
                f"with `pipeinfer calibrate` (it times prompt chunks), or give --prompt-len "
                f"{largest} or less")
