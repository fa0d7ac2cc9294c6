"""A reduced-vocabulary draft (draft_vocab.py) seen as a draft stage over token ids.

The reduced file takes embeddings, not token ids, and its logits have one column per kept
token. `ReducedStage` hides the first: given token ids, it gathers their rows of the full draft
file's token_embd (Embedder: ggml's own row conversion, so the numbers are what llama.cpp's
input layer computes from the same rows) and feeds those. `DraftVocab` is the map for the
second: column i of a logits row is token kept[i]. The Drafter keeps its logits rows in the
reduced width (the softmax and the two best over K floats instead of the vocabulary) and maps
only the tokens it picks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .draft_vocab import read_kept
from .embedding import Embedder


@dataclass(frozen=True)
class DraftVocab:
    """Which token id each logits column of a reduced draft stands for."""
    kept: np.ndarray     # int32, ascending: column i is token kept[i]
    n_vocab: int         # the full vocabulary's size

    @classmethod
    def of(cls, reduced: str | os.PathLike, n_vocab: int) -> "DraftVocab":
        return cls(read_kept(reduced), n_vocab)

    @property
    def size(self) -> int:
        return int(self.kept.size)

    def token(self, column: int) -> int:
        return int(self.kept[column])

    def full_row(self, row: np.ndarray) -> np.ndarray:
        """`row` over the whole vocabulary: tokens not kept get -inf (probability zero), for
        consumers that index logits by token id (specpipe's tree)."""
        full = np.full(self.n_vocab, -np.inf, dtype=np.float32)
        full[self.kept] = row
        return full


class ReducedStage:
    """A draft stage (Stage, a StageSlot or a LoadingStage of the reduced file) that takes
    token ids: decode(tokens=...) feeds their embeddings. Everything else is the stage's."""

    def __init__(self, stage: Any, embed: Embedder, vocab: DraftVocab):
        self._stage, self.embed, self.vocab = stage, embed, vocab

    def decode(self, positions: Sequence[int], seq_ids: Sequence[Sequence[int]], *,
               tokens: Sequence[int] | None = None, embd: np.ndarray | None = None,
               **kw) -> np.ndarray:
        """Stage.decode; logits rows have one column per kept token (DraftVocab)."""
        if tokens is not None:
            if embd is not None:
                raise ValueError("give exactly one of embd or tokens")
            embd = self.embed(tokens)
        return self._stage.decode(positions, seq_ids, embd=embd, **kw)

    def slot(self, k: int) -> "ReducedStage":
        """The same through context `k` of the stage (a draft per request, engine/head/lanes.py)."""
        return ReducedStage(self._stage.slot(k), self.embed, self.vocab)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stage, name)   # seq_cp, seq_rm, seq_keep, clear, cancel, ...
