"""The one hand-written GGUF parser: a fast, read-only parse of a GGUF file's header
(metadata scalars, numeric arrays, string array lengths, the byte span of every metadata entry,
tensor infos), without materialising tokenizer arrays. Everything else reads GGUF files with
the `gguf` package.

Kept because gguf.GGUFReader builds numpy views for every vocabulary entry: for a header
like Qwen2.5's (151,936 tokens, 151,387 merges) it takes seconds where this parse takes a
twentieth of one. Start-up, validation, head-side embeddings and stage writing read the header
on every rank, so those seconds would be paid per rank and per launch.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


class HeaderError(ValueError):
    """The bytes are not a well-formed GGUF header."""


@dataclass(frozen=True)
class StringArray:
    """A string array's length (its contents are skipped)."""
    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]     # GGUF order: ne0 (row length) first
    ggml_type: GGMLQuantizationType
    offset: int                # absolute file offset of the data

    @property
    def row_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.ggml_type]
        return self.shape[0] // block * size

    @property
    def n_bytes(self) -> int:
        rows = int(np.prod(self.shape[1:])) if len(self.shape) > 1 else 1
        return self.row_bytes * rows


@dataclass(frozen=True)
class Header:
    path: str
    version: int
    fields: dict
    tensors: dict[str, TensorInfo]   # in file order
    file_size: int
    # (start, end) file offsets of each whole metadata entry (key, type, value), in file order:
    # stage files copy entries as raw bytes.
    kv_spans: dict[str, tuple[int, int]]
    alignment: int

    def get(self, key: str, default=None):
        return self.fields.get(key, default)


class _Cursor:
    def __init__(self, buf, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str):
        try:
            value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        except struct.error:
            raise HeaderError(f"{self.path}: truncated GGUF header") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise HeaderError(f"{self.path}: truncated GGUF header")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return text

    def value(self, vtype: int):
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = self.unpack("<I"), self.unpack("<Q")
            if etype == GGUFValueType.STRING:
                for _ in range(count):
                    n = self.unpack("<Q")
                    self.pos += n  # skip the string's bytes
                if self.pos > len(self.buf):
                    raise HeaderError(f"{self.path}: truncated GGUF header")
                return StringArray(count)
            if etype not in _SCALARS:
                raise HeaderError(f"{self.path}: unsupported array element type {etype}")
            fmt = _SCALARS[GGUFValueType(etype)]
            size = struct.calcsize(fmt) * count
            if self.pos + size > len(self.buf):
                raise HeaderError(f"{self.path}: truncated GGUF header")
            values = np.frombuffer(self.buf, dtype=np.dtype(fmt), count=count, offset=self.pos)
            self.pos += size
            return values.tolist()
        if vtype not in _SCALARS:
            raise HeaderError(f"{self.path}: unknown metadata type {vtype}")
        return self.unpack(_SCALARS[GGUFValueType(vtype)])


def read_header(path: str | os.PathLike) -> Header:
    """Parse the header of `path`; HeaderError if it is not GGUF or is cut short."""
    path = str(path)
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        if size < 24 or handle.read(4) != GGUF_MAGIC:
            raise HeaderError(f"{path} is not a GGUF file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            view = memoryview(buf)
            try:
                return _parse(_Cursor(view, path), path, size)
            finally:
                view.release()


def _parse(cur: _Cursor, path: str, size: int) -> Header:
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in GGUF_VERSIONS:
        raise HeaderError(f"{path}: unsupported GGUF version {version}")
    n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
    fields, spans = {}, {}
    for _ in range(n_kv):
        start = cur.pos
        key = cur.string()
        fields[key] = cur.value(cur.unpack("<I"))
        spans[key] = (start, cur.pos)
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.unpack("<Q") for _ in range(cur.unpack("<I")))
        ttype, offset = cur.unpack("<I"), cur.unpack("<Q")
        try:
            infos.append((name, dims, GGMLQuantizationType(ttype), offset))
        except ValueError:
            raise HeaderError(f"{path}: tensor {name} has unknown type {ttype}") from None
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise HeaderError(f"{path}: invalid general.alignment {alignment!r}")
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    tensors = {n: TensorInfo(n, d, t, data_start + o) for n, d, t, o in infos}
    return Header(path, version, fields, tensors, size, spans, alignment)


def check_extents(header: Header) -> None:
    """HeaderError if any tensor's data runs past the end of the file."""
    for t in header.tensors.values():
        if t.offset + t.n_bytes > header.file_size:
            raise HeaderError(f"{header.path} is truncated: tensor {t.name} ends at byte "
                              f"{t.offset + t.n_bytes} of {header.file_size}")
