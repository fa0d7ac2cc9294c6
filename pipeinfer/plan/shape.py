"""A model's shape for the cost model, read from its GGUF header alone (no weights needed, so a
header-only file describes a model one does not have)."""

from __future__ import annotations

import os
from pathlib import Path

from gguf import Keys

from ..model.balance import layer_bytes
from ..model.gguf_header import Header
from ..model.slicing import model_info, read_model
from .cost import ModelShape

MB = 2 ** 20
KV_BYTES = 2  # f16 K and V cache entries


def model_shape(path: str | os.PathLike, kv_cells: int = 2048, header: Header | None = None,
                head_mb: float = 0.0) -> ModelShape:
    """The shape of the model at `path`: mean bytes of a layer (weights + a KV cache of
    `kv_cells` cells), bytes of the output layer, a token's hidden state between stages.
    `head_mb`: what the head holds besides its layers (the draft model)."""
    header = header or read_model(path)
    info = model_info(header, path)
    per_layer, final = layer_bytes(header, info.n_layer)
    arch = info.arch
    heads = int(header.get(Keys.Attention.HEAD_COUNT.format(arch=arch), 1) or 1)
    kv_heads = int(header.get(Keys.Attention.HEAD_COUNT_KV.format(arch=arch), heads) or heads)
    kv = 2 * kv_heads * (info.n_embd // heads) * KV_BYTES * kv_cells
    layer_mb = (sum(per_layer) / info.n_layer + kv) / MB
    return ModelShape(Path(path).name, info.n_layer, layer_mb, final / MB,
                      hidden_bytes=4 * info.n_embd, head_mb=head_mb)
