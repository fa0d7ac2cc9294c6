"""The configuration of one `pipeinfer run` job, as every rank sees it."""

from __future__ import annotations

from dataclasses import dataclass

from ..schedule.partition_pool import PartitionPool
from ..model.sampling import SamplingParams
from ..schedule.options import (DRAFT_SOURCES, EXACT_RUN_PLAIN, EXACT_RUN_REPACKED,
                                NGRAM_LIMIT, SpecOptions)

NEEDS_DRAFT = frozenset({"speculative", "pipeinfer", "pipespec", "specpipe"})
# strategies that can draft from the text itself (n-gram lookup; specpipe ranks a tree's
# candidates by how often each followed); pipespec needs a draft model's probabilities
NGRAM_STRATEGIES = frozenset({"speculative", "pipeinfer", "specpipe"})
MULTI_DRAFT = frozenset({"pipespec"})  # strategies that take several -md (smallest first)
WIDE_RUNS = frozenset({"specpipe", "pipespec"})  # their target runs are several tokens wide
STRATEGY_NAMES = ("iterative", "speculative", "pipeinfer", "pipespec", "specpipe")
# --draft-vocab auto: K = AUTO_DRAFT_VOCAB for pipeinfer on a pipeline of at least
# AUTO_DRAFT_VOCAB_RANKS ranks with a draft whose vocabulary has at least AUTO_DRAFT_VOCAB_MIN
# tokens (Qwen2.5's 151,936; not SmolLM2's 49,152), else the full vocabulary. Measured with the
# Qwen pair, interleaved K=3 (README, issue 34): 8 x 0.25 core 1.18x, 4 x 0.5 core 1.04x, but
# 2 x 1.0 core 0.95x: where the head's drafting does not set the pace, the lower acceptance
# (0.73 -> 0.65) costs more than the cheaper draft step gains.
AUTO = "auto"
AUTO_DRAFT_VOCAB = 32768
AUTO_DRAFT_VOCAB_MIN = 65536
AUTO_DRAFT_VOCAB_RANKS = 4


def draft_vocab_for(draft_vocab: int | str, strategy: str, n_vocab: int,
                    n_pipeline: int) -> int:
    """The K a head drafting for `strategy` over a `n_pipeline`-rank pipeline uses, its draft
    having `n_vocab` tokens: AUTO's rule, else `draft_vocab` as given (0: all)."""
    if draft_vocab != AUTO:
        return draft_vocab
    pays = (strategy == "pipeinfer" and n_vocab >= AUTO_DRAFT_VOCAB_MIN
            and n_pipeline >= AUTO_DRAFT_VOCAB_RANKS)
    return AUTO_DRAFT_VOCAB if pays else 0


@dataclass(frozen=True)
class RunConfig:
    model: str
    prompt: str | None          # None: no prompt of the job's own (serve: each request's)
    n_predict: int = 128
    n_ctx: int = 2048
    n_batch: int = 512
    draft: str | tuple[str, ...] | None = None   # several (smallest first) for pipespec
    strategy: str = "iterative"
    split: tuple[float, ...] | str | None = None  # the target's fractions, one per pipeline
                                                  # rank, or "auto" (plan/auto.py)
    profile: str | None = None               # --layer-split auto: the calibration profile
    leave_empty: bool = False                # ranks after the head may hold no layers (the
                                             # auto split leaves them out of the chain)
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
    repack: bool | None = None  # target stages' weight repacking; None: by strategy (below)
    exact: bool = True      # runs cut to the size llama.cpp computes like one token (README)
    trace: str | None = None
    full_logits: bool = False  # the last rank returns logits even under greedy sampling
                               # (serve: each request chooses its sampling)
    slots: int = 1          # llama.cpp contexts per stage: generations at once (serve)
    busy_strategy: str | None = None  # serve: the strategy of a generation started while
                                      # others are under way (None: `strategy`)
    compact_draft: bool = True  # load draft models as their Q4_0 copies (model/draft_cache.py)
    draft_vocab: int | str = AUTO  # the draft's output head over its K likeliest tokens
                                   # (model/draft_vocab.py); 0: the full vocabulary; AUTO:
                                   # the K of settled_draft_vocab, which rank 0 puts here
                                   # before anything loads (engine/startup/draft_files.py)

    @property
    def argmax_only(self) -> bool:
        """Whether the last rank returns each row's argmax instead of its logits."""
        return self.sampling.greedy and not self.full_logits

    @property
    def repack_target(self) -> bool:
        """Whether target stages load repacked weights: as asked, else yes (llama.cpp's default,
        faster), except for the strategies whose runs are wide (specpipe's tree levels,
        pipespec's verifications), which the plain layout keeps exact up to 7 tokens."""
        if self.repack is not None:
            return self.repack
        return self.strategy not in WIDE_RUNS

    @property
    def max_run(self) -> int:
        """Most tokens of a run after the prompt (options.py): exact, or n_batch."""
        if not self.exact:
            return self.n_batch
        return EXACT_RUN_REPACKED if self.repack_target else EXACT_RUN_PLAIN

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

    @property
    def uses_draft_model(self) -> bool:
        """Whether the head loads the draft model(s) (not for n-gram drafts alone)."""
        return self.speculates and self.spec.draft_source != "ngram"

    @property
    def reduces_draft(self) -> bool:
        """Whether a reduced-vocabulary draft can apply: the head drafts with one draft model
        of its own (pipespec's hierarchy checks its draft models against each other by token
        id, and a draft rank loads its model itself)."""
        return (self.uses_draft_model and self.strategy not in MULTI_DRAFT
                and not self.draft_ranks)

    def settled_draft_vocab(self, n_vocab: int, n_ranks: int) -> int:
        """The K the head drafts over (0: all), its draft having `n_vocab` tokens and the job
        `n_ranks` ranks: AUTO's where it pays (never an error: 0 elsewhere), else as given
        (0 without a draft model; check_drafts refuses a K where it cannot apply)."""
        if not self.reduces_draft:
            return 0
        return draft_vocab_for(self.draft_vocab, self.strategy, n_vocab,
                               self.n_pipeline(n_ranks))

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
        if spec.draft_source != "model" and strategy not in NGRAM_STRATEGIES:
            raise ValueError(draft_source_refusal(strategy, spec.draft_source))
        if self.uses_draft_model and not self.draft:
            if strategy in NGRAM_STRATEGIES:
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
        if self.strategy in MULTI_DRAFT or self.draft_ranks:
            raise ValueError(f"--draft-vocab: strategy {self.strategy} checks its draft "
                             "models against each other over the full vocabulary; give 0")

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


def resolve_draft_source(strategy: str, given: str | None, has_draft: bool) -> str:
    """--draft-source as given (ValueError for a strategy that drafts nothing), or its
    default: for the strategies that can use n-grams, both them and the model with -md, the
    n-grams alone without; the model for the others."""
    if given is not None:
        if strategy not in NEEDS_DRAFT:
            raise ValueError(draft_source_refusal(strategy, given))
        return given
    if strategy not in NGRAM_STRATEGIES:
        return "model"
    return "both" if has_draft else "ngram"


def draft_source_refusal(strategy: str, source: str) -> str:
    """Why `strategy` cannot take drafts from `source` (not "model")."""
    if strategy not in NEEDS_DRAFT:
        return f"--draft-source {source}: strategy {strategy} drafts nothing"
    return (f"--draft-source {source}: strategy {strategy} needs a draft model's "
            "probabilities, which n-gram drafts do not have; use speculative, pipeinfer or "
            "specpipe")
