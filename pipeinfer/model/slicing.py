"""Cutting a GGUF model into per-rank stage files (DESIGN.md section 2).

A stage file holds layers [first, last) of the source, renumbered from 0, with
`{arch}.block_count` set to the slice length and no tokenizer (a "none" tokenizer model of
`{arch}.vocab_size` rows). Non-final stages get a one-row vocabulary (zero
`token_embd`/`output` of shape [1, n_embd]) so llama.cpp does not compute a full output head
whose result nobody reads. Progress is logged: a stage file written
(INFO), every 64th tensor (DEBUG).
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import os
import re
import struct
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, Keys, MODEL_TENSOR, TENSOR_NAMES

from .gguf_header import Header, HeaderError, check_extents
from .models import ModelError, checked_header
from .partition import StageRange

# Architectures whose layers are all alike, so any contiguous slice is a valid model. Others
# (gemma2/3 with sliding-window patterns, per-layer head counts, ...) are refused.
UNIFORM_ARCHS = frozenset({"llama", "qwen2", "qwen3", "mistral3", "granite", "internlm2"})

log = logging.getLogger(__name__)

_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(.+)$")
_TOKEN_EMBD = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight"
_OUTPUT = TENSOR_NAMES[MODEL_TENSOR.OUTPUT] + ".weight"


class SliceError(ModelError):
    """The model cannot be sliced; the message says why."""


@dataclass(frozen=True)
class ModelInfo:
    path: str
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int


def open_model(path: str | os.PathLike) -> Header:
    """Check that a GGUF file is whole and parse its header (the source for write_stage)."""
    return read_model(path)


def read_model(path: str | os.PathLike) -> Header:
    """Check a GGUF file and parse its header (fast)."""
    return checked_header(path)


def model_info(source: GGUFReader | Header, path: str | os.PathLike) -> ModelInfo:
    """Architecture facts needed for slicing, refusing models whose layers differ by index.
    `source` is a parsed header (fast) or a GGUFReader."""
    if isinstance(source, GGUFReader):
        fields = {f.name: f.contents() for f in source.fields.values()
                  if not f.name.startswith("tokenizer.")}
        shapes = {t.name: tuple(int(d) for d in t.shape) for t in source.tensors}
    else:
        fields = source.fields
        shapes = {name: t.shape for name, t in source.tensors.items()}
    return _info(fields, shapes, path)


def _info(fields: dict, shapes: dict, path) -> ModelInfo:
    def field(key: str):
        if key not in fields:
            raise SliceError(f"{path}: GGUF metadata key {key} is missing")
        return fields[key]

    arch = field(Keys.General.ARCHITECTURE)
    if arch not in UNIFORM_ARCHS:
        raise SliceError(
            f"{path}: architecture {arch!r} is not supported for layer slicing (its layers may "
            f"differ by index); supported: {', '.join(sorted(UNIFORM_ARCHS))}")
    n_layer = int(field(Keys.LLM.BLOCK_COUNT.format(arch=arch)))
    n_embd = int(field(Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)))
    for name, value in fields.items():
        if (name.startswith(arch + ".") and isinstance(value, list) and len(value) == n_layer
                and len(set(value)) > 1):
            raise SliceError(f"{path}: per-layer hyperparameter {name} differs between "
                             "layers; slicing such models is not supported")
    if _TOKEN_EMBD not in shapes:
        raise SliceError(f"{path}: no {_TOKEN_EMBD} tensor")
    return ModelInfo(str(path), arch, n_layer, n_embd, int(shapes[_TOKEN_EMBD][1]))


def write_stage(source: Header | GGUFReader, info: ModelInfo, stage: StageRange,
                dst: Path, keep_tokenizer: bool = False) -> None:
    """Write the stage file for `stage` to `dst` (written to a temporary name, then renamed);
    `keep_tokenizer`: a final stage from layer 0 keeps the tokenizer, so that it is a model
    of its own (the tests' smaller drafts).

    `source` is the model's parsed header (open_model) or a GGUFReader of it. Metadata entries
    are copied as raw bytes: re-encoding a 150k-entry tokenizer through gguf's writer, after
    gguf's reader turned every entry into Python objects, took seconds per stage."""
    # A reader only gives the path: its per-entry objects are what the raw copy avoids.
    header = source if isinstance(source, Header) else read_model(source.data.filename)
    try:
        check_extents(header)
    except HeaderError as err:
        raise SliceError(str(err)) from None
    kvs = stage_kvs(header, info, stage, keep_tokenizer)
    tensors = stage_tensors(header, info, stage)
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    try:
        with open(header.path, "rb") as handle, \
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf, \
                open(tmp, "wb") as out:
            write_gguf(out, buf, kvs, tensors, header.alignment,
                       lambda i: log.debug("%s: tensor %d/%d", dst.name, i + 1, len(tensors)))
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()


def stage_kvs(header: Header, info: ModelInfo, stage: StageRange,
              keep_tokenizer: bool = False) -> list:
    """The stage's metadata entries: (start, end) spans of the source to copy, or new bytes."""
    # No stage file carries the tokenizer (rank 0 tokenizes from the model file): llama.cpp
    # builds a tokenizer's token map, merges and piece cache on the heap (Qwen2.5's 151,936
    # tokens: 35 MiB resident on the final stage). A "none" tokenizer with the vocabulary's
    # size gives the final stage's output head its rows and nothing else.
    overrides = {Keys.LLM.BLOCK_COUNT.format(arch=info.arch): kv_uint32(stage.n_layer),
                 Keys.Tokenizer.MODEL: kv_string("none"),
                 Keys.LLM.VOCAB_SIZE.format(arch=info.arch):
                     kv_uint32(info.n_vocab if stage.final else 1)}
    if keep_tokenizer and stage.final:
        overrides.pop(Keys.Tokenizer.MODEL)
    kvs = []
    for key, span in header.kv_spans.items():
        if key in overrides:
            kvs.append(kv_key(key) + overrides.pop(key))
        elif not key.startswith("tokenizer.") or (keep_tokenizer and stage.final):
            kvs.append(span)
    return kvs + [kv_key(key) + value for key, value in overrides.items()]


def stage_tensors(header: Header, info: ModelInfo, stage: StageRange) -> list:
    """(name, dims, type, data): data is an (offset, size) span of the source or new bytes."""
    tensors = []
    for t in header.tensors.values():
        span = (t.offset, t.n_bytes)
        m = _BLOCK_NAME.match(t.name)
        if m:
            layer = int(m.group(1))
            if stage.first <= layer < stage.last:
                tensors.append((f"blk.{layer - stage.first}.{m.group(2)}", t.shape,
                                t.ggml_type, span))
        elif stage.final and t.name == _TOKEN_EMBD and _OUTPUT in header.tensors:
            if info.arch not in TIED_OUTPUT_ARCHS:
                tensors.append(_unused_embedding(t))
        elif stage.final and t.name == _OUTPUT and info.arch in TIED_OUTPUT_ARCHS:
            tensors.append((_TOKEN_EMBD, t.shape, t.ggml_type, span))  # see TIED_OUTPUT_ARCHS
        elif stage.final or t.name not in (_TOKEN_EMBD, _OUTPUT):
            tensors.append((t.name, t.shape, t.ggml_type, span))
    if not stage.final:  # one-row zeros instead of the real embedding and output head
        zeros = bytes(4 * info.n_embd)
        tensors += [(n, (info.n_embd, 1), GGMLQuantizationType.F32, zeros)
                    for n in (_TOKEN_EMBD, _OUTPUT)]
    return tensors


# A final stage never reads its token embeddings (it takes activations), yet llama.cpp
# requires them at full shape. For these architectures llama.cpp takes the token embeddings as
# the output head when a model has no output.weight (tied embeddings), so a final stage gets
# the output head under the embeddings' name and nothing else: one copy, loaded once (Qwen2.5
# 1.5B's last stage: 43 MiB less resident than with zeroed embeddings, logits identical).
# Other architectures get zeroed embeddings of the smallest block type (_unused_embedding).
TIED_OUTPUT_ARCHS = frozenset({"llama", "qwen2", "qwen3", "mistral3", "granite", "phi3"})

# The smallest block types, (type, elements per block, bytes per block): zeros in them.
FILLER_TYPES = ((GGMLQuantizationType.IQ1_S, 256, 50), (GGMLQuantizationType.Q4_0, 32, 18))


def _unused_embedding(t) -> tuple:
    """A final stage's token embeddings, which it never reads (it takes activations, and its
    output head is a tensor of its own), yet llama.cpp requires at full shape: zeros in the
    smallest block type that fits (Qwen2.5 1.5B: 46 MB instead of 131 MB to send and hold)."""
    for ttype, block, nbytes in FILLER_TYPES:
        if t.shape[0] % block == 0:
            n_blocks = t.shape[0] // block * math.prod(t.shape[1:])
            return (t.name, t.shape, ttype, bytes(n_blocks * nbytes))
    return (t.name, t.shape, t.ggml_type, (t.offset, t.n_bytes))


def write_gguf(out, buf, kvs: list, tensors: list, align: int,
               progress: Callable[[int], None]) -> None:
    """A GGUF v3 file from metadata entries and tensors as stage_kvs/stage_tensors give
    them; spans are copied from `buf` (the source, memory-mapped) without an in-memory copy.
    `buf` may also be a list of sources (slice_pieces.py: a stage assembled from two files):
    a tensor's span is then (source index, offset, size); a metadata span is of the first."""
    infos, rel = [], 0
    for name, dims, ttype, data in tensors:
        infos.append(_string(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
                     + struct.pack("<IQ", ttype, rel))
        rel += _pad(_size(data), align)
    out.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    with ExitStack() as stack:
        views = [stack.enter_context(memoryview(b))
                 for b in (buf if isinstance(buf, list) else [buf])]
        for kv in kvs:
            _write(out, views, (0, kv[0], kv[1] - kv[0]) if isinstance(kv, tuple) else kv)
        out.write(b"".join(infos))
        out.write(bytes(_pad(out.tell(), align) - out.tell()))
        for i, (_, _, _, data) in enumerate(tensors):
            _write(out, views, data)
            out.write(bytes(_pad(_size(data), align) - _size(data)))
            if i % 64 == 0:
                progress(i)


def _write(out, views: list, data) -> None:
    """Write new bytes, or a span (offset, size) of the first source or (source, offset,
    size) of any."""
    if not isinstance(data, tuple):
        out.write(data)
        return
    source, offset, size = data if len(data) == 3 else (0, *data)
    with views[source][offset:offset + size] as part:
        out.write(part)


def gguf_size(kvs: list, tensors: list, align: int) -> int:
    """The size of the file write_gguf writes from the same entries, without writing it."""
    head = 24 + sum(kv[1] - kv[0] if isinstance(kv, tuple) else len(kv) for kv in kvs)
    head += sum(len(_string(name)) + 4 + 8 * len(dims) + 12 for name, dims, _, _ in tensors)
    return _pad(head, align) + sum(_pad(_size(data), align) for *_, data in tensors)


def stage_size(header: Header, info: ModelInfo, stage: StageRange) -> int:
    """The size of the stage file of `stage` (what write_stage would write), from the header."""
    return gguf_size(stage_kvs(header, info, stage), stage_tensors(header, info, stage),
                     header.alignment)


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _size(data) -> int:
    return data[-1] if isinstance(data, tuple) else len(data)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def kv_key(key: str) -> bytes:
    return _string(key)


def kv_uint32(value: int) -> bytes:
    return struct.pack("<II", GGUFValueType.UINT32, value)


def kv_string(value: str) -> bytes:
    return struct.pack("<I", GGUFValueType.STRING) + _string(value)


def split_model(path: str | os.PathLike, stages: list[StageRange],
                out_dir: str | os.PathLike) -> Path:
    """Write every stage of `stages` plus manifest.json into out_dir; return the manifest path."""
    header = open_model(path)
    info = model_info(header, path)
    _check_layers(info, stages)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for stage in stages:
        dst = out / f"stage-{stage.rank:02d}.gguf"
        if stage.n_layer == 0:
            entries.append({**asdict(stage), "file": None})
            continue
        log.info("writing %s (%s)", dst, stage)
        write_stage(header, info, stage, dst)
        entries.append({**asdict(stage), "file": dst.name})
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps({"source": str(Path(path).resolve()), "arch": info.arch,
                                    "n_layer": info.n_layer, "n_embd": info.n_embd,
                                    "stages": entries}, indent=2) + "\n")
    return manifest


def _check_layers(info: ModelInfo, stages: list[StageRange]) -> None:
    if not stages or stages[-1].last != info.n_layer:
        raise SliceError(f"{info.path}: the split covers {stages[-1].last if stages else 0} "
                         f"layers but the model has {info.n_layer}")
