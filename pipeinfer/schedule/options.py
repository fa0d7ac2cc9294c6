"""The scheduler's knobs (the CLI's speculation flags)."""

from __future__ import annotations

from dataclasses import dataclass

from .cutoff import FLOOR

# Drafts from the text itself (ngram.py): the defaults of --ngram-min/--ngram-max, and the
# largest n accepted. Here, not in ngram.py, so the command line reads them without numpy.
NGRAM_MIN, NGRAM_MAX = 2, 4
NGRAM_LIMIT = 16
DRAFT_SOURCES = ("model", "ngram", "both")

# Most tokens of a run after the prompt when the output must be exact. A speculative tree is
# verified as one batch, and llama.cpp gives every token of a batch the logits one-token
# decoding gives it, bit for bit, only up to a size (experiments/batch_exactness.py prints the
# table for a model and host; Qwen2.5-Coder Q4_K_M on AVX-512): with repacked weights up to 3
# tokens (4+ go through kernels that take 4 rows at a time), with the plain layout up to 7.
EXACT_RUN_REPACKED = 3
EXACT_RUN_PLAIN = 7


@dataclass(frozen=True)
class SpecOptions:
    draft: int = 4             # most tokens per micro-batch (tree depth)
    p_accept: float = 0.3      # keep drafting while the draft's top probability >= this
    p_split: float = 0.3       # branch when the runner-up candidate's probability > this
    n_parallel: int = 1        # most branches per tree
    p_recovery: float = 0.05   # cutoff grows by this per speculative run started
    p_decay: float = 0.01      # cutoff shrinks by this per draft attempt that yields nothing
    continuous: bool = True    # several speculative runs in flight (else one, of 2x --draft)
    cancel: bool = True        # early inference cancellation
    max_runs: int = 6          # runs in flight at once (speculative + the non-speculative one)
    partitions: int = 8        # KV sequence partitions for speculative runs
    kv_size: int = 0           # KV cells per stage; 0: 4x the context
    tree_width: int = 4        # specpipe: nodes per tree level (beam slots)
    tree_k: int = 2            # specpipe: draft candidates per bottom node
    draft_thread: bool = True  # pipeinfer: the draft model on a thread of its own
    p_floor: float = FLOOR     # the cutoff never decays below min(this, p_accept)
    draft_source: str = "model"  # model, ngram (prompt lookup) or both (n-grams first)
    guard: bool = True         # speculation pauses while it makes tokens slower (guard.py)
    row_costs: bool = True     # runs only as deep as their rows pay (model/row_costs.py)
    ngram_min: int = NGRAM_MIN   # shortest suffix an n-gram draft matches
    ngram_max: int = NGRAM_MAX   # longest (tried first)


@dataclass(frozen=True)
class Limits:
    """What the scheduler needs of the run's configuration besides the options."""
    n_batch: int               # largest batch a stage evaluates
    n_ctx: int                 # context size
    kv_size: int               # KV cells per stage
    n_stages: int              # stages holding target layers (the head's slice counts)
    max_run: int = EXACT_RUN_PLAIN  # most tokens per run after the prompt (n_batch: no limit)
    chunk: int = 0             # the prompt's batches end at multiples of this (0: n_batch)
    tail: int = 0              # the prompt's tokens after its last whole chunk go in runs
                               # of this (0: one run; speculation.prompt_runs)

    def __post_init__(self):
        if not self.chunk:
            object.__setattr__(self, "chunk", self.n_batch)
