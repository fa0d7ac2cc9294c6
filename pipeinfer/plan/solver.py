"""The split solver: layers per rank that minimise a strategy's bound within each node's memory.

Ranks keep their order (the chain 0 -> 1 -> ... is the launch's). Rank 0, the head, is always
in the chain; another rank may get no layers, and then leaves the chain (the rank before it
passes its output on, or is the last stage). The last rank holding layers also holds the
output layer. The bound is the sum of the ranks' items (cost.Pipeline.item) for "sum"
strategies and their maximum for "max" ones; both are searched exactly by dynamic programming
over (rank, layers left), which is tiny (ranks x layers^2).

Measured figures are noisy: among the splits whose bound is within `tolerance` of the best, the
solver takes the one with the lightest other measure: for "sum" the heaviest stage, for "max"
the heaviest worker stage (the head's drafting may set the bound, and then any split below it
would do: the stages are still balanced, for latency), so equal nodes get even shares instead
of all layers going to the one measured a hair faster; for "max", among the ties of that, the
most even worker stages (least sum of squares). The head's drafting counts in the
bounds but is no stage's load in these tie-breaks. A head that drafts gets layers only when
they lower the bound by a clear margin (HEAD_MARGIN; see solve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .cost import CostError, Pipeline, strategy_shape

TOLERANCE = 0.03
HEAD_MARGIN = 0.10  # a drafting head's layers must lower the bound by this share


class NoSplit(CostError):
    """No split fits; the message names the node and the fix."""


@dataclass(frozen=True)
class Split:
    """Layers per rank (0: not in the chain, except the head), the bound it reaches (ms per
    step of `step` tokens: the sum of stage times or the slowest stage), and each rank's item."""
    strategy: str
    counts: tuple[int, ...]
    bound_ms: float
    step: int
    items_ms: tuple[float, ...]

    @property
    def fractions(self) -> list[float]:
        total = sum(self.counts)
        return [c / total for c in self.counts]

    @property
    def last(self) -> int:
        return max(r for r, c in enumerate(self.counts) if c > 0)

    @property
    def dropped(self) -> list[int]:
        """Worker ranks without layers (the head is never dropped: it drafts and samples)."""
        return [r for r, c in enumerate(self.counts) if c == 0 and r > 0]

    @property
    def layer_split(self) -> str:
        """The split as --layer-split takes it (fractions reproducing the counts exactly)."""
        n = sum(self.counts)
        return ",".join(f"{c / n:.10g}" for c in self.counts)


def solve(pipe: Pipeline, strategy: str, may_drop: bool = True,
          head_layers: bool = True, tolerance: float = TOLERANCE,
          keep_worker: bool = False) -> Split:
    """The best split of `pipe.model`'s layers over `pipe.nodes` for `strategy`. `may_drop`:
    worker ranks may get no layers (else every rank after the head gets at least one);
    `head_layers`: the head may hold layers; `keep_worker`: at least one worker holds layers
    (a launched job: its pipeline has a stage after the head).

    A head that drafts (pipe.draft_tokens > 0) gets layers only if that lowers the bound by
    more than HEAD_MARGIN: its slice shares the head's CPU with the draft thread and the
    scheduler's loop, which cannot start, cancel or verify runs while the slice computes;
    the cost model adds the slice to the drafting but not that stall (on 4 x 0.5 core one
    head layer, 3 % "better" by the model, lost 2 % in run)."""
    if head_layers and pipe.draft_tokens > 0:
        try:
            without = _solve(pipe, strategy, may_drop, False, tolerance, keep_worker)
        except NoSplit:  # only with the head's memory does the model fit
            return _solve(pipe, strategy, may_drop, True, tolerance, keep_worker)
        best = _solve(pipe, strategy, may_drop, True, 0.0, keep_worker)
        if best.bound_ms >= without.bound_ms * (1 - HEAD_MARGIN):
            return without
    return _solve(pipe, strategy, may_drop, head_layers, tolerance, keep_worker)


def _solve(pipe: Pipeline, strategy: str, may_drop: bool, head_layers: bool,
           tolerance: float, keep_worker: bool) -> Split:
    shape, step = strategy_shape(strategy)
    search = _Search(pipe, shape, step, may_drop, head_layers)
    search.keep_worker = keep_worker and len(pipe.nodes) > 1
    best = search.best(primary=True, limit=math.inf)
    if best is None:
        raise NoSplit(search.why_not())
    slack = best[0] * (1 + tolerance) + 1e-9
    chosen = search.best(primary=False, limit=slack) or best
    if shape == "max" and chosen is not best:
        chosen = search.evenest(slack, chosen[0]) or chosen
    counts = chosen[1]
    items = tuple(search.item_of(r, c, counts) for r, c in enumerate(counts))
    bound = sum(items) if shape == "sum" else max(items)
    return Split(strategy, counts, bound, step, items)


class _Search:
    def __init__(self, pipe: Pipeline, shape: str, step: int, may_drop: bool,
                 head_layers: bool):
        self.pipe, self.shape, self.step = pipe, shape, step
        self.may_drop, self.head_layers = may_drop, head_layers
        self.n, self.L = len(pipe.nodes), pipe.model.n_layer
        self.keep_worker = False

    def item_of(self, rank: int, k: int, counts) -> float:
        if k == 0 and rank > 0:
            return 0.0
        final = rank == max(r for r, c in enumerate(counts) if c > 0) and k > 0
        return self.pipe.item(rank, k, final, self.step, self.shape)

    def drafting(self, rank: int) -> float:
        """The head's drafting in its item: not a stage's load, so the secondary measures
        (a stage's heaviest load) leave it out; else a head drafting 280 ms a run let the
        "sum" tie-break pile 24 of 28 layers on one worker, as light as the head."""
        return self.pipe.drafting_ms() if rank == 0 else 0.0

    def choices(self, rank: int, left: int):
        """(k, final) for rank `rank` with `left` layers still to place."""
        low = 0 if (rank == 0 or self.may_drop) else 1
        high = left if (rank > 0 or self.head_layers) else 0
        for k in range(low, high + 1):
            final = k == left and k > 0
            if final and rank == 0 and self.keep_worker:
                continue
            if k > 0 and k > self.pipe.memory_cap(rank, final):
                continue
            if final or rank + 1 < self.n:
                yield k, final

    def best(self, primary: bool, limit: float):
        """Primary search: (bound, counts) of the lowest bound. Secondary: among splits whose
        bound is at most `limit`, the lowest other measure; None if there is none."""
        if primary:
            return self._dp(add=self.shape == "sum", cap=math.inf)
        if self.shape == "max":
            return self._dp(add=False, cap=limit, workers_only=True)
        return self._sum_within(limit)

    def evenest(self, limit: float, heaviest: float):
        """"max" third measure: among splits whose bound is at most `limit` and whose worker
        stages are no heavier than `heaviest`, the one with the most even worker stages (the
        least sum of their squares). Else, with the head's drafting setting the bound, the
        secondary's ties (a stage of 6 layers as heavy as the last stage's 1 + output) went
        to the lowest counts first: 1, 2, 6, 6, 6, 6, 1 for 8 x 0.25 core."""
        return self._dp(add=True, cap=heaviest, workers_only=True, square=True,
                        head_cap=limit)

    def _dp(self, add: bool, cap: float, workers_only: bool = False, loads: bool = False,
            square: bool = False, head_cap: float | None = None):
        """(value, counts) of the split with the lowest sum (`add`) or maximum of the ranks'
        items (`workers_only`: of the ranks after the head; `square`: their squares), none of
        them over `cap` (the head's over `head_cap` if given); None if no split qualifies.
        `loads`: `cap` bounds the stages' loads (the head's drafting left out), not their
        items."""
        combine = (lambda a, b: a + b) if add else max

        @lru_cache(maxsize=None)
        def rest(rank: int, left: int):
            if left == 0:  # the ranks after the last stage are out of the chain
                return (0.0, (0,) * (self.n - rank)) if self.may_drop or rank == self.n \
                    else None
            if rank == self.n:
                return None
            options = []
            for k, final in self.choices(rank, left):
                own = self.pipe.item(rank, k, final, self.step, self.shape) \
                    if (k > 0 or rank == 0) else 0.0
                limit = head_cap if rank == 0 and head_cap is not None else cap
                fits = own - (self.drafting(rank) if loads else 0.0) <= limit + 1e-12
                tail = rest(rank + 1, left - k) if fits else None
                if tail is not None:
                    value = 0.0 if workers_only and rank == 0 else own * (own if square else 1)
                    options.append((combine(value, tail[0]), (k, *tail[1])))
            return min(options, default=None)
        return rest(0, self.L)

    def _sum_within(self, limit: float):
        """"sum" secondary: the lowest heaviest stage among splits whose sum is within
        `limit`: binary search on that heaviest stage's value, each a min-sum search."""
        values = sorted({self.pipe.item(r, k, f, self.step, self.shape) - self.drafting(r)
                         for r in range(self.n) for k in range(self.L + 1)
                         for f in (False, True) if k > 0 or r == 0})
        found, lo, hi = None, 0, len(values) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            result = self._dp(add=True, cap=values[mid], loads=True)
            if result is not None and result[0] <= limit:
                found, hi = result, mid - 1
            else:
                lo = mid + 1
        return found

    def why_not(self) -> str:
        """Why no split fits, naming the node and the fix."""
        pipe, m = self.pipe, self.pipe.model
        caps = [max(pipe.memory_cap(r, False), 0) for r in range(self.n)]
        if not self.head_layers:
            caps[0] = 0
        short = [r for r in range(1, self.n) if pipe.memory_cap(r, False) < 1]
        if short and not self.may_drop:
            r = short[0]
            return (f"node {r} ({pipe.nodes[r].name}) has {pipe.nodes[r].memory_mb:.0f} MB free, "
                    f"not enough for one layer of {m.name} ({m.layer_mb:.0f} MB + "
                    f"{m.base_mb:.0f} MB of runtime): give it more memory or launch without it")
        if not any(pipe.memory_cap(r, True) >= 1 for r in range(self.n)):
            return (f"no node has room for the output layer of {m.name} with one layer "
                    f"({m.output_mb + m.layer_mb:.0f} MB + {m.base_mb:.0f} MB of runtime): "
                    "add memory or nodes")
        return (f"the nodes hold at most {sum(caps)} of the {m.n_layer} layers of {m.name} "
                f"({m.layer_mb:.0f} MB each, output layer {m.output_mb:.0f} MB): add nodes or "
                "memory, or use a smaller model")
