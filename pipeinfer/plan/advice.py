"""`pipeinfer plan`'s content: per strategy the solver's split (nodes that would only slow the
pipeline left out), the simulator's predicted speed, TTFT (a prompt's evaluation and the first
token), prefill speed and ITL on it, and the exact command line that runs it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .. import strategies
from ..config.drafts import AUTO, draft_vocab_for
from ..model.gguf_header import read_header
from ..model.slicing import model_info
from .inputs import Setup
from .simulate import SimConfig, simulate
from .solver import Split, solve


@dataclass(frozen=True)
class Advice:
    strategy: str
    split: Split
    speed_tps: float
    ttft_s: float            # the prompt's evaluation and the first token
    prefill_tps: float       # the prompt's tokens per second of TTFT
    itl_s: float
    command: str
    draft_vocab: int = 0     # the draft's K kept tokens as modelled (0: the full vocabulary)
    prompt_len: int = 0
    chunk: int = 0           # the prompt's batch size

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "layers": list(self.split.counts),
                "nodes_used": [r for r, c in enumerate(self.split.counts) if c or r == 0],
                "bound_ms": round(self.split.bound_ms, 3), "speed_tps": round(self.speed_tps, 3),
                "ttft_s": round(self.ttft_s, 4), "prefill_tps": round(self.prefill_tps, 2),
                "prompt_len": self.prompt_len, "prefill_chunk": self.chunk,
                "itl_s": round(self.itl_s, 4), "draft_vocab": self.draft_vocab,
                "command": self.command}


def advise(setup: Setup, cfg: SimConfig, run_args: list[str]) -> Advice:
    """The solver's split for `cfg.strategy` and the simulator's figures of `cfg`'s
    generation on it."""
    strategy = cfg.strategy
    split = solve(setup.pipeline(strategy), strategy, may_drop=True)
    result = simulate(setup.pipeline(), list(split.counts), cfg)
    return Advice(strategy, split, result.speed_tps, result.ttft_s, result.prefill_tps,
                  result.itl_s, command_line(setup, split, strategy, run_args),
                  setup.draft_vocab, cfg.prompt_len, cfg.chunk)


def command_line(setup: Setup, split: Split, strategy: str, run_args: list[str]) -> str:
    """The mpiexec command of the kept nodes (the head and every node with layers)."""
    kept = [r for r, c in enumerate(split.counts) if c or r == 0]
    n = sum(split.counts)
    fractions = ",".join(f"{split.counts[r] / n:.10g}" for r in kept)
    cmd = ["mpiexec", "-n", str(len(kept))]
    if setup.hosts:
        cmd += ["-hosts", ",".join(setup.hosts[r] for r in kept)]
    cmd += ["pipeinfer", "run", "-m", str(setup.model)]
    if setup.draft is not None and strategies.get(strategy).speculates:
        cmd += ["-md", str(setup.draft_named or setup.draft)]
        if not setup.compact:
            cmd += ["--no-compact-draft"]
        if setup.draft_vocab != _run_default_k(setup, strategy, len(kept)):
            cmd += ["--draft-vocab", str(setup.draft_vocab)]
    cmd += ["--strategy", strategy, "--layer-split", fractions]
    threads = {setup.threads[r] if len(setup.threads) > 1 else setup.threads[0] for r in kept}
    if threads != {1}:
        cmd += ["-t", ",".join(str(setup.threads[r] if len(setup.threads) > 1
                                   else setup.threads[0]) for r in kept)]
    return shlex.join(cmd + run_args)


def _run_default_k(setup: Setup, strategy: str, n_ranks: int) -> int:
    """The K `run --draft-vocab auto` settles on for this draft on `n_ranks` ranks (the
    solver may leave nodes out, and auto depends on how many ranks are left)."""
    full = setup.embeddings or setup.draft
    return draft_vocab_for(AUTO, strategy, model_info(read_header(full), full).n_vocab, n_ranks)


def table(advice: list[Advice], setup: Setup) -> str:
    names = [n.name for n in setup.nodes]
    rows = []
    if advice:
        rows.append(f"TTFT: a {advice[0].prompt_len}-token prompt in batches of "
                    f"{advice[0].chunk} tokens and the first token")
    rows.append(f"{'strategy':12} {'layers per node':24} {'t/s':>7} {'TTFT ms':>8} "
                f"{'prefill t/s':>11} {'ITL ms':>7}")
    for a in advice:
        layers = ",".join(map(str, a.split.counts))
        rows.append(f"{a.strategy:12} {layers:24} {a.speed_tps:7.2f} {1e3 * a.ttft_s:8.0f} "
                    f"{a.prefill_tps:11.1f} {1e3 * a.itl_s:7.0f}")
        left = [names[r] for r in a.split.dropped]
        if left:
            rows.append(f"  left out (they would only slow it): {', '.join(left)}")
        rows.append(f"  {a.command}")
    return "\n".join(rows)
