"""Cutting a GGUF model into per-rank stage files (DESIGN.md section 2).

A stage file holds layers [first, last) of the source, renumbered from 0, with
`{arch}.block_count` set to the slice length. Non-final stages also get a one-row vocabulary
(no tokenizer, zero `token_embd`/`output` of shape [1, n_embd]) so llama.cpp does not compute
a full output head whose result nobody reads.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys, MODEL_TENSOR, TENSOR_NAMES

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


def open_model(path: str | os.PathLike) -> GGUFReader:
    """Open a GGUF file read-only (memory-mapped) after checking it is whole. Slow for big
    vocabularies (every entry becomes a Python object): only for writing stage files."""
    check_gguf(path)
    return GGUFReader(path, "r")


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


def write_stage(reader: GGUFReader, info: ModelInfo, stage: StageRange, dst: Path,
                progress: Callable[[str], None] | None = None) -> None:
    """Write the stage file for `stage` to `dst` (written to a temporary name, then renamed)."""
    arch = info.arch
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    writer = GGUFWriter(tmp, arch)
    overrides = {Keys.LLM.BLOCK_COUNT.format(arch=arch): (stage.n_layer, GGUFValueType.UINT32)}
    if not stage.final:
        overrides[Keys.Tokenizer.MODEL] = ("none", GGUFValueType.STRING)
        overrides[Keys.LLM.VOCAB_SIZE.format(arch=arch)] = (1, GGUFValueType.UINT32)
    _copy_metadata(reader, writer, overrides, drop_tokenizer=not stage.final)

    tensors = []  # (name, array, type)
    for t in reader.tensors:
        m = _BLOCK_NAME.match(t.name)
        if m:
            layer = int(m.group(1))
            if stage.first <= layer < stage.last:
                tensors.append((f"blk.{layer - stage.first}.{m.group(2)}", t.data, t.tensor_type))
        elif not stage.final and t.name in (_TOKEN_EMBD, _OUTPUT):
            continue  # replaced by one-row zeros below
        else:
            tensors.append((t.name, t.data, t.tensor_type))
    if not stage.final:
        zeros = np.zeros((1, info.n_embd), dtype=np.float32)
        tensors += [(_TOKEN_EMBD, zeros, None), (_OUTPUT, zeros, None)]

    for name, data, ttype in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, ttype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, (name, data, _) in enumerate(tensors):
        writer.write_tensor_data(data)
        if progress and i % 64 == 0:
            progress(f"{dst.name}: tensor {i + 1}/{len(tensors)}")
    writer.close()
    os.replace(tmp, dst)


def _copy_metadata(reader: GGUFReader, writer: GGUFWriter, overrides: dict, drop_tokenizer: bool):
    for field in reader.fields.values():
        name = field.name
        if name == Keys.General.ARCHITECTURE or name.startswith("GGUF.") or name in overrides:
            continue
        if drop_tokenizer and name.startswith("tokenizer."):
            continue
        if name == Keys.General.ALIGNMENT:
            writer.add_custom_alignment(int(field.contents()))
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub_type)
    for name, (value, vtype) in overrides.items():
        writer.add_key_value(name, value, vtype)


def split_model(path: str | os.PathLike, stages: list[StageRange], out_dir: str | os.PathLike,
                progress: Callable[[str], None] | None = None) -> Path:
    """Write every stage of `stages` plus manifest.json into out_dir; return the manifest path."""
    reader = open_model(path)
    info = model_info(reader, path)
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
        write_stage(reader, info, stage, dst, progress)
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
