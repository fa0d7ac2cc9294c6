"""The strategies table: name -> `run(pipe, gen, sampler, cfg, drafter, pool)`.

Every strategy is a policy on the scheduler core (pipeinfer/schedule/), driven by
pipeinfer/engine/."""

from __future__ import annotations

from ..engine.generate import strategy_runner
from ..schedule.options import SpecOptions

__all__ = ["STRATEGIES", "NEEDS_DRAFT", "MULTI_DRAFT", "SpecOptions"]

STRATEGIES = {"iterative": strategy_runner("iterative"),
              "speculative": strategy_runner("speculative"),
              "pipeinfer": strategy_runner("pipeinfer"),
              "pipespec": strategy_runner("pipespec"),
              "specpipe": strategy_runner("specpipe")}
NEEDS_DRAFT = frozenset({"speculative", "pipeinfer", "pipespec", "specpipe"})
MULTI_DRAFT = frozenset({"pipespec"})  # strategies that take several -md (smallest first)
