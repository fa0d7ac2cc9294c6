"""The configuration of one `pipeinfer run` job, as every rank sees it."""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.partition_pool import PartitionPool
from ..model.sampling import SamplingParams
from ..schedule.options import SpecOptions

NEEDS_DRAFT = frozenset({"speculative", "pipeinfer", "pipespec", "specpipe"})
MULTI_DRAFT = frozenset({"pipespec"})  # strategies that take several -md (smallest first)
STRATEGY_NAMES = ("iterative", "speculative", "pipeinfer", "pipespec", "specpipe")


@dataclass(frozen=True)
class RunConfig:
    model: str
    prompt: str
    n_predict: int = 128
    n_ctx: int = 2048
    n_batch: int = 512
    draft: str | tuple[str, ...] | None = None   # several (smallest first) for pipespec
    strategy: str = "iterative"
    split: tuple[float, ...] | None = None   # the target's fractions, one per pipeline rank
    draft_ranks: int = 0                     # pipespec: ranks of their own for the drafts
    threads: tuple[int, ...] = (1,)
    sampling: SamplingParams = SamplingParams()
    spec: SpecOptions = SpecOptions()
    ignore_eos: bool = False
    chat: bool = False
    csv: str | None = None
    json: bool = False
    verbose: int = 0
    label: str = ""
    repack: bool = True
    trace: str | None = None

    @property
    def drafts(self) -> tuple[str, ...]:
        """The draft models given (-md may be repeated), smallest first."""
        if not self.draft:
            return ()
        return (self.draft,) if isinstance(self.draft, str) else tuple(self.draft)

    def n_pipeline(self, size: int) -> int:
        """The target pipeline's ranks (0..n-1); the draft ranks follow them."""
        return size - self.draft_ranks

    def threads_for(self, rank: int) -> int:
        return self.threads[rank] if len(self.threads) > 1 else self.threads[0]

    @property
    def speculates(self) -> bool:
        return self.strategy in NEEDS_DRAFT

    def pool(self) -> PartitionPool | None:
        if self.strategy == "specpipe":  # one partition: the tree's beam slots
            return PartitionPool(1, self.spec.tree_width)
        return PartitionPool(self.spec.partitions, self.spec.n_parallel) if self.speculates \
            else None

    @property
    def kv_size(self) -> int:
        """KV cells per stage. Speculative strategies never reuse a cell within a generation
        (partition_pool explains why), so they need room for rejected tokens too."""
        if not self.speculates:
            return self.n_ctx
        return self.spec.kv_size or 4 * self.n_ctx
