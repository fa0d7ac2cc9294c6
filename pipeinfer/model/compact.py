"""Compact drafts: a GGUF copy whose wider weight matrices are requantized to Q4_0.

A draft model's numbers only decide what is guessed, never the output (the target verifies
every token), so its speed matters more than its last bits.  llama.cpp repacks Q4_0 (and
Q4_K) matrices into its fast interleaved CPU layout but not Q5_0, Q5_1, Q8_0 or Q6_K ones,
and Qwen2.5-Coder 0.5B's Q4_K_M file is mostly those: with them requantized to Q4_0 it
drafts markedly faster on one thread (the documentation's results give the figures).

``compact_copy`` rewrites every 2-D ``*.weight`` matrix of those types as Q4_0 (dequantized
with ``gguf.quants``, requantized with its reference Q4_0 quantizer, 4096 rows at a time);
``token_embd.weight`` (only ever row-gathered, so its layout costs nothing), norms, biases,
every other tensor and all metadata are copied unchanged, in the same order.  The file is
written next to ``dst`` under a temporary name and renamed into place once it checks out:
a crash leaves no partial file under the final name.  For qwen-coder-0.5b (157 of 291
tensors requantized, 491 MB -> 378 MB) it took 14 s on one core of that host (7 s of it
gguf.GGUFReader parsing the 151,936-token vocabulary, 6 s requantizing), once: the model
cache makes it at fetch time (``pipeinfer models fetch qwen-coder-0.5b-q4_0``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFWriter, \
    GGUFValueType, Keys, quants

from .gguf_files import ModelError, Progress, check_gguf, say

log = logging.getLogger(__name__)


Q = GGMLQuantizationType
TARGET = Q.Q4_0
# Wider than Q4_0 and not repacked by llama.cpp's CPU backend; gguf.quants dequantizes each.
SOURCE_TYPES = frozenset({Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q6_K})
KEEP = frozenset({"token_embd.weight"})
_BLOCK, _BLOCK_BYTES = GGML_QUANT_SIZES[TARGET]
_CHUNK_ROWS = 4096
COMPACT_VERSION = 1  # bump when the compact file's contents change (draft_cache keys on it)


def converts(name: str, qtype: GGMLQuantizationType, shape: Sequence[int]) -> bool:
    """Whether ``compact_copy`` requantizes this tensor (``shape`` in ggml order, ne0 first:
    the row length, which must be a whole number of Q4_0 blocks)."""
    return (qtype in SOURCE_TYPES and len(shape) == 2 and name.endswith(".weight")
            and name not in KEEP and int(shape[0]) % _BLOCK == 0)


def _is_complete(path: Path) -> bool:
    try:
        check_gguf(path)
    except ModelError:
        return False
    return True


def compact_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                 progress: Progress = None) -> Path:
    """Write ``src`` to ``dst`` with its Q5_0/Q5_1/Q8_0/Q6_K matrices as Q4_0; return ``dst``.

    A no-op when ``dst`` already is a complete GGUF file.  Safe against crashes (temporary
    file, then an atomic rename) and against a concurrent call (the last rename wins; both
    files are the same), but callers that may race should hold a lock to avoid the double
    work, as the model cache does.  Raises ModelError if ``src`` is not a readable GGUF file.
    """
    src, dst = Path(src), Path(dst)
    if _is_complete(dst):
        say(log, progress, f"{dst.name}: already compacted")
        return dst
    check_gguf(src)
    reader = GGUFReader(src)
    if reader.endianess != GGUFEndian.LITTLE:
        raise ModelError(f"{src} is a big-endian GGUF file; only little-endian ones are compacted")
    plan = [(t, converts(t.name, t.tensor_type, t.shape)) for t in reader.tensors]
    n = sum(conv for _, conv in plan)
    say(log, progress, f"requantizing {n} of {len(plan)} tensors of {src.name} to Q4_0")
    start = time.monotonic()
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.partial")  # the umask's mode, unlike mkstemp
    try:
        _write(reader, plan, tmp, progress)
        check_gguf(tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    say(log, progress, f"wrote {dst.name} in {time.monotonic() - start:.0f} s "
                   f"({src.stat().st_size / 1e6:.0f} MB -> {dst.stat().st_size / 1e6:.0f} MB)")
    return dst


def _write(reader: GGUFReader, plan: list, path: Path, progress: Progress) -> None:
    """The GGUF file itself: metadata and tensor infos first, then the tensors one by one
    (streamed, so at most one requantized matrix is in memory)."""
    writer = GGUFWriter(path, reader.fields[Keys.General.ARCHITECTURE].contents())
    for field in reader.fields.values():
        if field.name == Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    writer.data_alignment = reader.alignment  # general.alignment, if any, was copied above
    for t, conv in plan:
        if conv:
            rows, row = int(t.shape[1]), int(t.shape[0])
            writer.add_tensor_info(t.name, (rows, row), np.dtype(np.float32),
                                   rows * (row // _BLOCK) * _BLOCK_BYTES, raw_dtype=TARGET)
        else:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.n_bytes,
                                   raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total = sum(t.n_elements for t, conv in plan if conv) or 1
    done, reported = 0, 0
    for t, conv in plan:
        writer.write_tensor_data(_requantize(t) if conv else t.data)
        if conv:
            done += t.n_elements
            if done * 4 // total > reported:
                reported = done * 4 // total
                say(log, progress, f"  {25 * reported}% of the matrices requantized")
    writer.close()


def _requantize(t) -> np.ndarray:
    """Tensor ``t``'s rows as Q4_0 blocks (uint8, one row of blocks per matrix row)."""
    rows = t.data
    out = np.empty((rows.shape[0], int(t.shape[0]) // _BLOCK * _BLOCK_BYTES), dtype=np.uint8)
    for i in range(0, rows.shape[0], _CHUNK_ROWS):
        chunk = quants.dequantize(rows[i:i + _CHUNK_ROWS], t.tensor_type)
        out[i:i + _CHUNK_ROWS] = quants.quantize(chunk, TARGET)
    return out
