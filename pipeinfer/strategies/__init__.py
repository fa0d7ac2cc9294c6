"""The strategies table: name -> `run(pipe, gen, sampler, cfg, drafter, pool)`.

Every strategy is a policy on the scheduler core (pipeinfer/schedule/), driven by
pipeinfer/engine/."""

from __future__ import annotations

from ..engine.head.generate import strategy_runner
from ..schedule.options import SpecOptions

__all__ = ["STRATEGIES", "SpecOptions"]

STRATEGIES = {"iterative": strategy_runner("iterative"),
              "speculative": strategy_runner("speculative"),
              "pipeinfer": strategy_runner("pipeinfer"),
              "pipespec": strategy_runner("pipespec"),
              "specpipe": strategy_runner("specpipe")}
