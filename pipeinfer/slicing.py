"""Cutting a GGUF model into per-rank stage files (DESIGN.md section 2).

A stage file holds layers [first, last) of the source, renumbered from 0, with
`{arch}.block_count` set to the slice length. Non-final stages also get a one-row vocabulary
(no tokenizer, zero `token_embd`/`output` of shape [1, n_embd]) so llama.cpp does not compute
a full output head whose result nobody reads.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from gguf import (GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, Keys,
                  MODEL_TENSOR, TENSOR_NAMES)

from .gguf_header import Header, read_header
from .models import ModelError, check_gguf
from .partition import StageRange

# Architectures whose layers are all alike, so any contiguous slice is a valid model. Others
# (gemma2/3 with sliding-window patterns, per-layer head counts, ...) are refused.
UNIFORM_ARCHS = frozenset({"llama", "qwen2", "qwen3", "mistral3", "granite", "internlm2"})

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
    check_gguf(path)
    return read_header(path)


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


def write_stage(source: Header | GGUFReader, info: ModelInfo, stage: StageRange, dst: Path,
                progress: Callable[[str], None] | None = None) -> None:
    """Write the stage file for `stage` to `dst` (written to a temporary name, then renamed).

    `source` is the model's parsed header (open_model) or a GGUFReader of it. Metadata entries
    are copied as raw bytes: re-encoding a 150k-entry tokenizer through gguf's writer, after
    gguf's reader turned every entry into Python objects, took seconds per stage."""
    path = source.path if isinstance(source, Header) else source.data.filename
    arch = info.arch
    overrides = {Keys.LLM.BLOCK_COUNT.format(arch=arch): _kv_uint32(stage.n_layer)}
    if not stage.final:
        overrides[Keys.Tokenizer.MODEL] = _kv_string("none")
        overrides[Keys.LLM.VOCAB_SIZE.format(arch=arch)] = _kv_uint32(1)
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    with open(path, "rb") as handle, \
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        src = _scan(buf, path)
        kvs = []
        for key, span in src.kvs:
            if key in overrides:
                kvs.append(_kv_key(key) + overrides.pop(key))
            elif not (not stage.final and key.startswith("tokenizer.")):
                kvs.append(buf[span[0]:span[1]])
        kvs += [_kv_key(key) + value for key, value in overrides.items()]

        tensors = []  # (name, dims, type, bytes or (offset, size) in the source)
        for name, dims, ttype, offset, size in src.tensors:
            m = _BLOCK_NAME.match(name)
            if m:
                layer = int(m.group(1))
                if stage.first <= layer < stage.last:
                    tensors.append((f"blk.{layer - stage.first}.{m.group(2)}", dims, ttype,
                                    (offset, size)))
            elif not stage.final and name in (_TOKEN_EMBD, _OUTPUT):
                continue  # replaced by one-row zeros below
            else:
                tensors.append((name, dims, ttype, (offset, size)))
        if not stage.final:
            zeros = bytes(4 * info.n_embd)
            tensors += [(n, (info.n_embd, 1), GGMLQuantizationType.F32, zeros)
                        for n in (_TOKEN_EMBD, _OUTPUT)]

        align = src.alignment
        infos, rel = [], 0
        for name, dims, ttype, data in tensors:
            infos.append(_string(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
                         + struct.pack("<IQ", ttype, rel))
            rel += _pad(_size(data), align)
        try:
            with open(tmp, "wb") as out:
                out.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
                for chunk in (*kvs, *infos):
                    out.write(chunk)
                out.write(bytes(_pad(out.tell(), align) - out.tell()))
                for i, (name, _, _, data) in enumerate(tensors):
                    if isinstance(data, tuple):
                        offset, size = data
                        with memoryview(buf) as view, view[offset:offset + size] as part:
                            out.write(part)  # no copy of the tensor in memory
                    else:
                        out.write(data)
                    size = _size(data)
                    out.write(bytes(_pad(size, align) - size))
                    if progress and i % 64 == 0:
                        progress(f"{dst.name}: tensor {i + 1}/{len(tensors)}")
            os.replace(tmp, dst)
        finally:
            if tmp.exists():
                tmp.unlink()


@dataclass
class _RawGGUF:
    kvs: list          # (key, (start, end) byte span of the whole entry)
    tensors: list      # (name, dims, type, absolute data offset, data size)
    alignment: int


_SCALAR_SIZES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2,
                 GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4,
                 GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1, GGUFValueType.UINT64: 8,
                 GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}


def _scan(buf, path) -> _RawGGUF:
    """Byte spans of every metadata entry and the tensor infos of a GGUF file (v2/v3, little
    endian). The file passed check_gguf, so errors here mean a malformed header."""
    try:
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        pos, kvs, alignment = 24, [], 32
        for _ in range(n_kv):
            start = pos
            n, = struct.unpack_from("<Q", buf, pos)
            key = bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8")
            vtype, = struct.unpack_from("<I", buf, pos + 8 + n)
            pos = pos + 12 + n
            if vtype == GGUFValueType.ARRAY:
                etype, count = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if etype == GGUFValueType.STRING:
                    unpack = struct.Struct("<Q").unpack_from
                    for _ in range(count):
                        pos += 8 + unpack(buf, pos)[0]
                else:
                    pos += _SCALAR_SIZES[GGUFValueType(etype)] * count
            elif vtype == GGUFValueType.STRING:
                pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
            else:
                if key == Keys.General.ALIGNMENT:
                    alignment = struct.unpack_from("<I", buf, pos)[0]
                pos += _SCALAR_SIZES[GGUFValueType(vtype)]
            kvs.append((key, (start, pos)))
        infos = []
        for _ in range(n_tensors):
            n, = struct.unpack_from("<Q", buf, pos)
            name = bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8")
            n_dims, = struct.unpack_from("<I", buf, pos + 8 + n)
            pos += 12 + n
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos)
            pos += 8 * n_dims
            ttype, offset = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            infos.append((name, dims, GGMLQuantizationType(ttype), offset))
    except (struct.error, ValueError, KeyError) as err:
        raise SliceError(f"{path}: malformed GGUF header ({err})") from None
    data_start = _pad(pos, alignment)
    tensors = []
    for name, dims, ttype, offset in infos:
        block, type_size = GGML_QUANT_SIZES[ttype]
        n_elements = 1
        for d in dims:
            n_elements *= d
        tensors.append((name, dims, ttype, data_start + offset, n_elements // block * type_size))
    if tensors and max(o + n for _, _, _, o, n in tensors) > len(buf):
        raise SliceError(f"{path} is truncated: tensor data runs past the end of the file")
    return _RawGGUF(kvs, tensors, alignment)


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _size(data) -> int:
    return data[1] if isinstance(data, tuple) else len(data)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _kv_key(key: str) -> bytes:
    return _string(key)


def _kv_uint32(value: int) -> bytes:
    return struct.pack("<II", GGUFValueType.UINT32, value)


def _kv_string(value: str) -> bytes:
    return struct.pack("<I", GGUFValueType.STRING) + _string(value)


def split_model(path: str | os.PathLike, stages: list[StageRange], out_dir: str | os.PathLike,
                progress: Callable[[str], None] | None = None) -> Path:
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
        if progress:
            progress(f"writing {dst} ({stage})")
        write_stage(header, info, stage, dst, progress)
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
