"""The configuration of a job, as every rank sees it: built once from the command line (or by
a library caller), checked once (`check`), then handed to every layer."""

from __future__ import annotations

from dataclasses import dataclass

from .. import strategies
from ..schedule.options import (DRAFT_SOURCES, EXACT_RUN_PLAIN, EXACT_RUN_REPACKED,
                                NGRAM_LIMIT, SpecOptions)
from ..schedule.partition_pool import PartitionPool
from ..strategies import TREE, Strategy
from .drafts import AUTO, draft_source_refusal, draft_vocab_for
from .run import OutputConfig, RequestConfig

MAX_SEQUENCES = 254   # llama.cpp's 256, less sequence 0 and the graveyard
PREFILL_CHUNK = 64    # the prompt's batch size by default (see JobConfig.chunk)
PREFILL_TAIL = 16     # the runs of its tokens after the last whole chunk (prompt_runs)


@dataclass(frozen=True)
class JobConfig:
    model: str
    drafts: tuple[str, ...] = ()   # draft models (-md), smallest first (pipespec: several)
    strategy: str = strategies.DEFAULT
    split: tuple[float, ...] | str | None = None  # the target's fractions, one per pipeline
                                                  # rank, or "auto" (plan/auto.py)
    profile: str | None = None               # --layer-split auto: the calibration profile
    leave_empty: bool = False                # ranks after the head may hold no layers (the
                                             # auto split leaves them out of the chain)
    draft_ranks: int = 0                     # pipespec: ranks of their own for the drafts
    threads: tuple[int, ...] = (1,)
    n_ctx: int = 2048
    n_batch: int = 512
    prefill_chunk: int = PREFILL_CHUNK   # the prompt's batches end at multiples of this
    prefill_tail: int = PREFILL_TAIL     # ... and its last partial chunk goes in runs of this
    spec: SpecOptions = SpecOptions()
    repack: bool | None = None  # target stages' weight repacking; None: by strategy (below)
    exact: bool = True      # runs cut to the size llama.cpp computes like one token
    compact_draft: bool = True  # load draft models as their Q4_0 copies (model/draft_cache.py)
    draft_vocab: int | str = AUTO  # the draft's output head over its K likeliest tokens
                                   # (model/draft_vocab.py); 0: the full vocabulary; AUTO:
                                   # the K of settled_draft_vocab, which rank 0 puts here
                                   # before anything loads (engine/files/draft_files.py)
    full_logits: bool = False  # the last rank returns logits even under greedy sampling
                               # (serve: each request chooses its sampling)
    slots: int = 1          # llama.cpp contexts per stage: generations at once (serve)
    refill_along: bool = False  # serve: each slot has a refill context of n_ctx cells
                                # (model/stage.py, engine/head/refill.py)
    busy_strategy: str | None = None  # serve: the strategy of a generation started while
                                      # others are under way (None: `strategy`)
    request: RequestConfig = RequestConfig()   # run: the job's own generation
    output: OutputConfig = OutputConfig()

    @property
    def plan(self) -> Strategy:
        """The strategy's entry (pipeinfer/strategies/)."""
        return strategies.get(self.strategy)

    @property
    def argmax_only(self) -> bool:
        """Whether the last rank returns each row's argmax instead of its logits."""
        return self.request.sampling.greedy and not self.full_logits

    @property
    def repack_target(self) -> bool:
        """Whether target stages load repacked weights: as asked, else yes (llama.cpp's default,
        faster), except for the strategies whose runs are wide (specpipe's tree levels,
        pipespec's verifications), which the plain layout keeps exact up to 7 tokens."""
        if self.repack is not None:
            return self.repack
        return not self.plan.wide_runs

    @property
    def chunk(self) -> int:
        """The prompt's batch size: batches end at its multiples, so that a prefix kept from
        an earlier request computes as a fresh evaluation would (engine/head/prompt_cache.py).
        Small enough that the pipeline's stages all work while a prompt goes in."""
        return min(self.prefill_chunk, self.n_batch)

    @property
    def max_run(self) -> int:
        """Most tokens of a run after the prompt (options.py): exact, or n_batch."""
        if not self.exact:
            return self.n_batch
        return EXACT_RUN_REPACKED if self.repack_target else EXACT_RUN_PLAIN

    def n_pipeline(self, size: int) -> int:
        """The target pipeline's ranks (0..n-1); the draft ranks follow them."""
        return size - self.draft_ranks

    def threads_for(self, rank: int) -> int:
        return self.threads[rank] if len(self.threads) > 1 else self.threads[0]

    @property
    def speculates(self) -> bool:
        return self.plan.speculates

    @property
    def uses_draft_model(self) -> bool:
        """Whether the head loads the draft model(s) (not for n-gram drafts alone)."""
        return self.speculates and self.spec.draft_source != "ngram"

    @property
    def reduces_draft(self) -> bool:
        """Whether a reduced-vocabulary draft can apply: the head drafts with one draft model
        of its own (pipespec's hierarchy checks its draft models against each other by token
        id, and a draft rank loads its model itself)."""
        return (self.uses_draft_model and not self.plan.several_drafts
                and not self.draft_ranks)

    def settled_draft_vocab(self, n_vocab: int, n_ranks: int) -> int:
        """The K the head drafts over (0: all), its draft having `n_vocab` tokens and the job
        `n_ranks` ranks: AUTO's where it pays (never an error: 0 elsewhere), else as given
        (0 without a draft model; check_drafts refuses a K where it cannot apply)."""
        if not self.reduces_draft:
            return 0
        return draft_vocab_for(self.draft_vocab, self.strategy, n_vocab,
                               self.n_pipeline(n_ranks))

    def check(self) -> None:
        """ValueError saying what is wrong, if anything, with these settings together (what
        needs the model file or the job's size is checked when the job starts)."""
        spec, plan = self.spec, strategies.get(self.strategy)
        if spec.partitions * spec.n_parallel > MAX_SEQUENCES:
            raise ValueError(f"--partitions x --n-parallel must be at most {MAX_SEQUENCES} "
                             "(llama.cpp's sequence limit)")
        if plan.drafts == TREE and spec.tree_width > self.n_batch:
            raise ValueError(f"--tree-width ({spec.tree_width}) must be at most the batch "
                             f"size (-b {self.n_batch}): a tree level is evaluated in one batch")
        if self.profile is not None and self.split != "auto":
            raise ValueError("--profile is read by --layer-split auto only; add it, or drop "
                             "--profile")
        for strategy in filter(None, (self.strategy, self.busy_strategy)):
            if self.slots > 1 and not strategies.get(strategy).lanes:
                raise ValueError(f"--parallel {self.slots}: strategy {strategy} generates one "
                                 "request at a time (use --parallel 1, or one of "
                                 f"{', '.join(strategies.names(lanes=True))})")
        self.check_drafts()

    def check_drafts(self) -> None:
        """ValueError if the draft source cannot work with this strategy and -md."""
        spec, strategy = self.spec, self.strategy
        if spec.draft_source not in DRAFT_SOURCES:
            raise ValueError(f"unknown draft source {spec.draft_source!r}")
        low, high = spec.ngram_min, spec.ngram_max
        if not (1 <= low <= NGRAM_LIMIT and 1 <= high <= NGRAM_LIMIT):
            raise ValueError(f"--ngram-min and --ngram-max must be 1 to {NGRAM_LIMIT}, got "
                             f"{low} and {high}")
        if low > high:
            raise ValueError(f"--ngram-min ({low}) is larger than --ngram-max ({high})")
        if spec.draft_source != "model" and not self.plan.ngram:
            raise ValueError(draft_source_refusal(strategy, spec.draft_source))
        if self.uses_draft_model and not self.drafts:
            if self.plan.ngram:
                raise ValueError(f"--draft-source {spec.draft_source} needs a draft model "
                                 "(-md); without one use --draft-source ngram")
            raise ValueError(f"strategy {strategy} needs a draft model (-md)")
        self._check_draft_vocab()

    def _check_draft_vocab(self) -> None:
        """--draft-vocab needs the head's own Drafter (engine/drafting/drafter.py): pipespec's
        hierarchy verifies one draft model with another by token id, and a draft rank loads
        its model itself. Without a draft model it changes nothing. AUTO is never refused."""
        if self.draft_vocab == AUTO:
            return
        if not isinstance(self.draft_vocab, int) or self.draft_vocab < 0:
            raise ValueError(f"--draft-vocab must be {AUTO} or a number of tokens, 0 or more "
                             f"(got {self.draft_vocab!r})")
        if not self.draft_vocab or not self.uses_draft_model:
            return
        if self.plan.several_drafts or self.draft_ranks:
            raise ValueError(f"--draft-vocab: strategy {self.strategy} checks its draft "
                             "models against each other over the full vocabulary; give 0")

    def pool(self) -> PartitionPool | None:
        if self.plan.drafts == TREE:  # one partition: the tree's beam slots
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
