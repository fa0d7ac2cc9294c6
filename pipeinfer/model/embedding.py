"""Token embeddings computed on the head, so that every slice is fed activations.

Rows of `token_embd.weight` are read from the memory-mapped source GGUF and converted by
ggml's own row routines: the result is exactly what llama.cpp's input layer would compute.
The rows of recent tokens are kept converted: the head embeds a token or a few per run, and
on a core that slept since the last run reading a row from the map and converting it costs
tens of microseconds, while text uses the same few thousand tokens again and again.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Sequence

import numpy as np
from gguf import MODEL_TENSOR, TENSOR_NAMES

from .gguf_header import Header, read_header
from .llama_lib import dequantize_rows

_TOKEN_EMBD = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight"
# The converted rows an Embedder keeps at most: 4,096 of a 1,024-wide model, 2,730 of
# Qwen2.5 1.5B's (1,536 wide), 512 of an 8,192-wide one.
KEPT_ROWS_BYTES = 16 << 20


class Embedder:
    def __init__(self, model_path: str | os.PathLike, header: Header | None = None):
        header = header or read_header(model_path)
        tensor = header.tensors.get(_TOKEN_EMBD)
        if tensor is None:
            raise ValueError(f"{model_path}: no {_TOKEN_EMBD} tensor")
        self.n_embd, self.n_vocab = tensor.shape[0], tensor.shape[1]
        # memory-mapped raw bytes, one row per token (a plain array over the map: indexing a
        # np.memmap goes through Python code, and the head embeds a few tokens per run)
        self._rows = np.memmap(model_path, dtype=np.uint8, mode="r", offset=tensor.offset,
                               shape=(self.n_vocab, tensor.row_bytes)).view(np.ndarray)
        self._type = tensor.ggml_type
        # converted rows by token, least recently used first, at most KEPT_ROWS_BYTES of them
        self._kept: OrderedDict[int, np.ndarray] = OrderedDict()
        self.max_kept = max(1, KEPT_ROWS_BYTES // (4 * self.n_embd))

    def __call__(self, tokens: Sequence[int]) -> np.ndarray:
        """The tokens' embeddings, one float32 row per token (a new array)."""
        kept = self._kept
        missing = [t for t in dict.fromkeys(tokens) if t not in kept]
        if missing:
            self._convert(missing)
        out = np.empty((len(tokens), self.n_embd), dtype=np.float32)
        for i, token in enumerate(tokens):
            out[i] = kept[token]
            kept.move_to_end(token)
        while len(kept) > self.max_kept:   # (after the copies: a run may hold more tokens)
            kept.popitem(last=False)
        return out

    def _convert(self, tokens: list[int]) -> None:
        """Read and convert the rows of `tokens` and keep them."""
        if min(tokens) < 0 or max(tokens) >= self.n_vocab:
            raise ValueError(f"token id out of range 0..{self.n_vocab - 1}")
        rows = dequantize_rows(self._rows[np.asarray(tokens, dtype=np.intp)], self._type,
                               self.n_embd)
        rows.flags.writeable = False
        self._kept.update(zip(tokens, rows))
