"""Token embeddings computed on the head, so that every slice is fed activations.

Rows of `token_embd.weight` are read from the memory-mapped source GGUF and converted by
ggml's own row routines: the result is exactly what llama.cpp's input layer would compute.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
from gguf import MODEL_TENSOR, TENSOR_NAMES

from .gguf_header import Header, read_header
from .llama_lib import dequantize_rows

_TOKEN_EMBD = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight"


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

    def __call__(self, tokens: Sequence[int]) -> np.ndarray:
        if len(tokens) and (min(tokens) < 0 or max(tokens) >= self.n_vocab):
            raise ValueError(f"token id out of range 0..{self.n_vocab - 1}")
        return dequantize_rows(self._rows[np.asarray(tokens, dtype=np.intp)], self._type,
                               self.n_embd)
