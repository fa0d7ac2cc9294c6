"""Drafts without a draft model (prompt lookup, n-gram drafting): text that repeats what came
before (editing code, rewriting a document, answering about a pasted text) is predicted by
what followed the same words earlier.

The last n tokens of the context (the prompt, everything accepted and the speculation being
continued) are looked up in the tokens before them, n from `n_max` down to `n_min`: the
longest suffix that occurred before wins, at its latest occurrence, and the draft is what
followed it there (at most `budget` tokens; past the end of the context the copy reads its
own output, so a repeating pattern goes on repeating). Free on the head:
a lookup is a few vector compares over the context, no model evaluation. A tree of drafts
(specpipe) takes every token that followed the suffix instead (`ngram_candidates`), ranked.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .options import NGRAM_LIMIT, NGRAM_MAX, NGRAM_MIN

__all__ = ["NGRAM_LIMIT", "NGRAM_MAX", "NGRAM_MIN", "check_sizes", "ngram_candidates",
           "ngram_draft"]


def check_sizes(n_min: int, n_max: int) -> None:
    """ValueError unless 1 <= n_min <= n_max (the command line says it to users first:
    JobConfig.check_drafts)."""
    if not 1 <= n_min <= n_max:
        raise ValueError(f"n-gram sizes must satisfy 1 <= n_min <= n_max, got {n_min}, {n_max}")


def ngram_draft(context: Sequence[int], n_min: int, n_max: int, budget: int) -> list[int]:
    """The tokens that followed the latest earlier occurrence of the longest suffix of
    `context` of n_min..n_max tokens (at most `budget`); none if no such suffix occurred."""
    check_sizes(n_min, n_max)
    tokens = np.asarray(context, dtype=np.int64)
    size = len(tokens)
    if budget <= 0 or size < n_min + 1:
        return []
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        start = _latest(tokens, n)
        if start is not None:
            return _copy(tokens.tolist(), start + n, budget)
    return []


def ngram_candidates(context: Sequence[int], n_min: int, n_max: int) -> list[tuple[int, int]]:
    """The next tokens the text suggests after `context`, for a tree of drafts: every token
    that followed an earlier occurrence of the longest suffix of n_min..n_max tokens that
    occurred before, with how often it did, the most frequent first and among equally
    frequent ones the latest first. Empty if no such suffix occurred."""
    check_sizes(n_min, n_max)
    tokens = np.asarray(context, dtype=np.int64)
    size = len(tokens)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        starts = _occurrences(tokens, n)
        if starts.size:
            found: dict[int, list[int]] = {}   # token -> [count, latest start]
            for start in starts.tolist():
                entry = found.setdefault(int(tokens[start + n]), [0, 0])
                entry[0], entry[1] = entry[0] + 1, start
            ranked = sorted(found.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))
            return [(token, count) for token, (count, _) in ranked]
    return []


def _copy(tokens: list[int], src: int, budget: int) -> list[int]:
    """`budget` tokens copied from `src` on, the copy reading its own output once it reaches
    the end (a repeating pattern goes on repeating)."""
    out = []
    for _ in range(budget):
        token = tokens[src]
        tokens.append(token)
        out.append(token)
        src += 1
    return out


def _latest(tokens: np.ndarray, n: int) -> int | None:
    """Start of the latest occurrence of the last n tokens that ends before the last token
    (so that at least one token follows it); None if there is none."""
    hits = _occurrences(tokens, n)
    return int(hits[-1]) if hits.size else None


def _occurrences(tokens: np.ndarray, n: int) -> np.ndarray:
    """Starts of the occurrences of the last n tokens that end before the last token, in
    order."""
    windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # starts 0..size-1-n
    return np.flatnonzero((windows == tokens[-n:]).all(axis=1))
