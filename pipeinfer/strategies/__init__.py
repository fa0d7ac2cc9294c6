"""The strategies table: name -> `run(pipe, gen, sampler, cfg, drafter, pool)`.

iterative, speculative and pipeinfer are policies on the scheduler core
(pipeinfer/schedule/), driven by pipeinfer/engine/; pipespec and specpipe still run loops of
their own here until they move onto the core too."""

from __future__ import annotations

from ..engine.generate import strategy_runner
from ..schedule.options import SpecOptions
from . import specpipe

__all__ = ["STRATEGIES", "NEEDS_DRAFT", "MULTI_DRAFT", "SpecOptions"]

STRATEGIES = {"iterative": strategy_runner("iterative"),
              "speculative": strategy_runner("speculative"),
              "pipeinfer": strategy_runner("pipeinfer"),
              "pipespec": strategy_runner("pipespec"), "specpipe": specpipe.run}
NEEDS_DRAFT = frozenset({"speculative", "pipeinfer", "pipespec", "specpipe"})
MULTI_DRAFT = frozenset({"pipespec"})  # strategies that take several -md (smallest first)
