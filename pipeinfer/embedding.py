"""Token embeddings computed on the head, so that every slice is fed activations.

Rows of `token_embd.weight` are read from the memory-mapped source GGUF and converted by
ggml's own row routines: the result is exactly what llama.cpp's input layer would compute.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
from gguf import GGUFReader, MODEL_TENSOR, TENSOR_NAMES

from .llama_lib import dequantize_rows

_TOKEN_EMBD = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight"


class Embedder:
    def __init__(self, model_path: str | os.PathLike, reader: GGUFReader | None = None):
        reader = reader or GGUFReader(model_path, "r")
        tensor = next((t for t in reader.tensors if t.name == _TOKEN_EMBD), None)
        if tensor is None:
            raise ValueError(f"{model_path}: no {_TOKEN_EMBD} tensor")
        self._rows = tensor.data  # memory-mapped, one row per token
        self._type = tensor.tensor_type
        self.n_embd = int(tensor.shape[0])
        self.n_vocab = int(tensor.shape[1])

    def __call__(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise ValueError(f"token id out of range 0..{self.n_vocab - 1}")
        return dequantize_rows(self._rows[ids], self._type, self.n_embd)
