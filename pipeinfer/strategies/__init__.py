"""Head scheduling strategies. Each is a module with `run(pipe, gen, sampler, n_batch, ...)`."""

from . import iterative

STRATEGIES = {"iterative": iterative.run}
NEEDS_DRAFT = frozenset()
