"""A tiny llama whose matrices are stored in a mix of types (Q5_0, Q5_1, Q8_0, F16, Q4_0):
a draft the compact copy converts (test_compact.py, test_plan_calibrate.py)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

# Per tensor name (less a block's "blk.N."), the type the mixed tiny model stores it in (the
# rest: F32).
MIXED = {"token_embd.weight": Q.Q8_0, "output.weight": Q.Q8_0, "attn_q.weight": Q.Q5_0,
         "attn_k.weight": Q.Q5_1, "attn_v.weight": Q.Q8_0, "attn_output.weight": Q.F16,
         "ffn_gate.weight": Q.Q4_0, "ffn_up.weight": Q.Q5_0, "ffn_down.weight": Q.Q8_0}


def mixed_type(name: str) -> Q:
    return MIXED.get(name.split(".", 2)[2] if name.startswith("blk.") else name, Q.F32)


def write_mixed(f32: Path, dst: Path) -> Path:
    """`f32` (an f32 tiny llama) with each tensor stored as MIXED says, written to `dst`."""
    def requant(t):
        q = mixed_type(t.name)
        return None if q == Q.F32 else gguf.quants.quantize(np.array(t.data), q)

    return copy_with(f32, dst, requant)


def copy_with(src: Path, dst: Path, tensor) -> Path:
    """tinymodel.copy_gguf, but ``tensor(t)`` may return raw quantized blocks."""
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for f in reader.fields.values():
        if f.name != "general.architecture" and not f.name.startswith("GGUF."):
            sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    for t in reader.tensors:
        data = tensor(t)
        q = t.tensor_type if data is None else mixed_type(t.name)
        w.add_tensor(t.name, np.array(t.data) if data is None else data, raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
