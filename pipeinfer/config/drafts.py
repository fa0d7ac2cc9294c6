"""Where a job's drafts come from, settled from the command line: --draft-source's default
for a strategy, and --draft-vocab auto's K."""

from __future__ import annotations

from .. import strategies

# --draft-vocab auto: K = AUTO_DRAFT_VOCAB for pipeinfer on a pipeline of at least
# AUTO_DRAFT_VOCAB_RANKS ranks with a draft whose vocabulary has at least AUTO_DRAFT_VOCAB_MIN
# tokens (Qwen2.5's 151,936; not SmolLM2's 49,152), else the full vocabulary: the reduced
# draft pays where the head's drafting sets the pace (quarter-core nodes), while on fewer,
# larger nodes its lower acceptance costs more than its cheaper step gains (docs/results).
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
    pays = (strategy == strategies.PIPEINFER.name and n_vocab >= AUTO_DRAFT_VOCAB_MIN
            and n_pipeline >= AUTO_DRAFT_VOCAB_RANKS)
    return AUTO_DRAFT_VOCAB if pays else 0


def resolve_draft_source(strategy: str, given: str | None, has_draft: bool) -> str:
    """--draft-source as given (ValueError for a strategy that drafts nothing), or its
    default: for the strategies that can use n-grams, both them and the model with -md, the
    n-grams alone without; the model for the others."""
    plan = strategies.get(strategy)
    if given is not None:
        if not plan.speculates:
            raise ValueError(draft_source_refusal(strategy, given))
        return given
    if not plan.ngram:
        return "model"
    return "both" if has_draft else "ngram"


def draft_source_refusal(strategy: str, source: str) -> str:
    """Why `strategy` cannot take drafts from `source` (not "model")."""
    if not strategies.get(strategy).speculates:
        return f"--draft-source {source}: strategy {strategy} drafts nothing"
    ngram = strategies.names(ngram=True)
    either = ", ".join(ngram[:-1]) + f" or {ngram[-1]}"
    return (f"--draft-source {source}: strategy {strategy} needs a draft model's "
            f"probabilities, which n-gram drafts do not have; use {either}")
