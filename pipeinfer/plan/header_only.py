"""A header-only GGUF: a model's metadata and tensor infos from its published dimensions, no
weights. The cost model reads layers and bytes from it (shape.py), so the planner and the
simulator can size models that are not at hand (e.g. a 70B-class target)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

Q = GGMLQuantizationType


@dataclass(frozen=True)
class Dims:
    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    weights: GGMLQuantizationType = Q.Q4_K      # the layers' matrices
    output: GGMLQuantizationType = Q.Q6_K       # the output matrix (as in Q4_K_M files)


# Llama 3 70B's published dimensions
LLAMA3_70B = Dims("llama-3-70b-q4_k_m", 80, 8192, 28672, 64, 8, 128256)


def _nbytes(shape: tuple[int, int], qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return shape[1] // block * size * shape[0]


def tensors(d: Dims) -> list[tuple[str, tuple[int, int], GGMLQuantizationType]]:
    """(name, (rows, row length), type) of every tensor of a llama-architecture model."""
    kv = d.n_embd // d.n_head * d.n_head_kv
    out = [("token_embd.weight", (d.n_vocab, d.n_embd), d.weights)]
    for i in range(d.n_layer):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (1, d.n_embd), Q.F32),
                (b + "attn_q.weight", (d.n_embd, d.n_embd), d.weights),
                (b + "attn_k.weight", (kv, d.n_embd), d.weights),
                (b + "attn_v.weight", (kv, d.n_embd), d.weights),
                (b + "attn_output.weight", (d.n_embd, d.n_embd), d.weights),
                (b + "ffn_norm.weight", (1, d.n_embd), Q.F32),
                (b + "ffn_gate.weight", (d.n_ff, d.n_embd), d.weights),
                (b + "ffn_up.weight", (d.n_ff, d.n_embd), d.weights),
                (b + "ffn_down.weight", (d.n_embd, d.n_ff), d.weights)]
    out += [("output_norm.weight", (1, d.n_embd), Q.F32),
            ("output.weight", (d.n_vocab, d.n_embd), d.output)]
    return out


def write(path: str | os.PathLike, d: Dims) -> None:
    writer = GGUFWriter(str(path), "llama")
    writer.add_name(d.name)
    writer.add_block_count(d.n_layer)
    writer.add_context_length(8192)
    writer.add_embedding_length(d.n_embd)
    writer.add_feed_forward_length(d.n_ff)
    writer.add_head_count(d.n_head)
    writer.add_head_count_kv(d.n_head_kv)
    writer.add_vocab_size(d.n_vocab)
    writer.add_layer_norm_rms_eps(1e-5)
    for name, shape, qtype in tensors(d):
        # 1-D norms are written with their one dimension
        logical = (shape[1],) if shape[0] == 1 else shape
        writer.add_tensor_info(name, logical, np.dtype(np.float32), _nbytes(shape, qtype), qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
