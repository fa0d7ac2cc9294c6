"""The strategies, each declared once, in the one table of this module: what it is called,
its help sentence, its scheduler (a policy on the pure core of pipeinfer/schedule/), how it
drafts, what it needs, and how the planner costs it. The command line's choices and help,
every check of a configuration, the head's scheduler and draft executor, `plan` and
`simulate`, and the order and colours of the results' charts all derive from it: adding a
strategy is one scheduler module and one entry here.

Nothing heavy is imported: a scheduler class is imported when a generation asks for it, so
`pipeinfer --help` stays fast."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

# How a strategy drafts (which draft executors its driver gets: engine/head/generate.py).
NONE, TOKENS, TREE, HIERARCHY = "none", "tokens", "tree", "hierarchy"


@dataclass(frozen=True)
class Strategy:
    name: str
    summary: str               # its sentence in --strategy's help
    scheduler: str             # "module:Class" under pipeinfer.schedule
    drafts: str = NONE         # NONE, TOKENS (a draft model and/or n-grams), TREE, HIERARCHY
    ngram: bool = False        # can draft from the text itself (--draft-source ngram, both)
    several_drafts: bool = False   # takes several -md, smallest first
    wide_runs: bool = False    # its runs are several tokens wide: the plain layout by default
    lanes: bool = True         # its requests may share the pipeline (serve --parallel)
    draft_thread: bool = False  # its draft model drafts on a thread beside the head's loop
    keeps_draft_context: bool = False   # a serving slot keeps its draft model's context
    bound: str = "sum"         # what bounds its speed: the sum of stage times, or the max
    run_tokens: int = 1        # tokens of a typical run after the prompt (the cost model's)
    simulated: bool = False    # plan and simulate model it
    color: str = "#7f7f7f"     # its colour in charts
    choice: bool = True        # a --strategy of the command line (else internal)

    @property
    def speculates(self) -> bool:
        return self.drafts != NONE

    def scheduler_class(self):
        module, _, name = self.scheduler.partition(":")
        return getattr(importlib.import_module(f"pipeinfer.schedule.{module}"), name)

    def draft_tokens(self, with_draft_model: bool) -> int:
        """Tokens the head's draft model drafts per run: a pipelined run's micro-batch, a
        synchronous tree's depth (its root is the pending token); none without one."""
        if not with_draft_model or not self.speculates:
            return 0
        return self.run_tokens if self.bound == "max" else self.run_tokens - 1


ITERATIVE = Strategy(
    "iterative", "pipeline-parallel decoding, one token per pass.", "iterative:Iterative",
    simulated=True, color="#4c72b0")
SPECULATIVE = Strategy(
    "speculative", "draft a token tree, verify it in one pass, repeat (synchronous).",
    "speculative:Speculative", drafts=TOKENS, ngram=True, keeps_draft_context=True,
    run_tokens=3, simulated=True, color="#dd8452")
PIPEINFER = Strategy(
    "pipeinfer", "asynchronous continuous speculation in micro-batches with KV "
    "multibuffering and early cancellation.", "pipeinfer:PipeInfer", drafts=TOKENS,
    ngram=True, draft_thread=True, keeps_draft_context=True, bound="max", run_tokens=3,
    simulated=True, color="#55a868")
PIPESPEC = Strategy(
    "pipespec", "a hierarchy of draft models (PipeSpec), each verifying the one before it, "
    "the target verifying the last.", "pipespec:PipeSpec", drafts=HIERARCHY,
    several_drafts=True, wide_runs=True, lanes=False, bound="max", run_tokens=4,
    color="#bcbd22")
SPECPIPE = Strategy(
    "specpipe", "SpecPipe/PipeDec, one level of a fixed-width draft tree per pipeline step, "
    "rerooted on a hit, flushed on a miss (--tree-width, --tree-k).", "specpipe:SpecPipe",
    drafts=TREE, ngram=True, wide_runs=True, bound="max", run_tokens=4, color="#17becf")
# pipeinfer for a request that shares the pipeline (serve --busy-strategy auto): while
# others are under way it verifies its drafts in its own next token's run
ADAPTIVE = Strategy(
    "pipeinfer-adaptive", "pipeinfer that verifies its drafts in its own runs while other "
    "requests are under way.", "adaptive:AdaptivePipeInfer", drafts=TOKENS, ngram=True,
    draft_thread=True, keeps_draft_context=True, bound="max", run_tokens=3, choice=False)

STRATEGIES = {s.name: s for s in (ITERATIVE, SPECULATIVE, PIPEINFER, PIPESPEC, SPECPIPE,
                                   ADAPTIVE)}
NAMES = tuple(name for name, s in STRATEGIES.items() if s.choice)   # --strategy's choices
DEFAULT = ITERATIVE.name


def get(name: str) -> Strategy:
    """The strategy called `name` (ValueError naming the known ones if none is)."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(NAMES)}") from None


def names(**wanted) -> tuple[str, ...]:
    """The --strategy choices whose attributes have the values given (e.g. lanes=True)."""
    return tuple(n for n in NAMES
                 if all(getattr(STRATEGIES[n], k) == v for k, v in wanted.items()))


def help_text() -> str:
    """--strategy's help: every choice's sentence."""
    return " ".join(f"{n}: {STRATEGIES[n].summary}" for n in NAMES) + \
        " All are exact under greedy sampling."
