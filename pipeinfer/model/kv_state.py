"""A sequence's KV cells as llama.cpp writes them (Stage.seq_state), taken apart by layer, so
that a stage's cells can be assembled from copies of other stages' layers (job/restore.py:
after a host is lost, a neighbour takes over some of its layers and their kept cells).

The layout, in the llama.cpp build pipeinfer ships (llama_context::state_seq_get_data, then
llama_kv_cache::state_write): u32 magic, i32 sequence id; u32 streams (1), u32 cells; per cell i32 position, u32 sequence count, that many i32 sequence ids; u32
v_trans, u32 layers; per layer the K rows (i32 type, u64 row bytes, a row per cell); then per
layer V: without v_trans as K, with it i32 type, u32 element bytes, u32 rows, and per row an
element per cell. Layers are independent blocks, cells are rows (or columns, for transposed
V): a copy of layers [a, b) and one of [b, c) of the same cells make one of [a, c) whose
bytes are what a stage of [a, c) would have written. Anything else in a blob (another layout,
cells with extra fields) is refused, never guessed at: parse() returns None.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

U32, I32, U64 = struct.Struct("<I"), struct.Struct("<i"), struct.Struct("<Q")
K_HEAD = struct.Struct("<iQ")        # type, row bytes
V_TRANS_HEAD = struct.Struct("<iII")  # type, element bytes, rows


@dataclass(frozen=True)
class Layer:
    """One layer's K and V blocks: `k` (cells x row bytes), `v` (cells x row bytes, or with
    v_trans rows x cells x element bytes), and their headers as written."""
    k_head: bytes
    k: np.ndarray
    v_head: bytes
    v: np.ndarray


@dataclass(frozen=True)
class KvState:
    prefix: bytes                  # the magic and sequence id, as written
    positions: np.ndarray          # each cell's position (int32)
    meta: tuple[bytes, ...]        # each cell's position and sequence ids, as written
    v_trans: int
    layers: tuple[Layer, ...]

    @property
    def n_layer(self) -> int:
        return len(self.layers)

    def first(self, n: int) -> "KvState":
        """Only the cells of positions below `n`."""
        keep = np.flatnonzero(self.positions < n)
        return KvState(self.prefix, self.positions[keep], tuple(self.meta[i] for i in keep),
                       self.v_trans, tuple(Layer(L.k_head, L.k[keep], L.v_head,
                                   L.v[:, keep] if self.v_trans else L.v[keep])
                             for L in self.layers))

    def sliced(self, start: int, stop: int) -> "KvState":
        """Only layers [start, stop) (indices within this state)."""
        return KvState(self.prefix, self.positions, self.meta, self.v_trans,
                       self.layers[start:stop])

    def to_bytes(self) -> bytes:
        out = [self.prefix, U32.pack(1), U32.pack(len(self.positions)), *self.meta,
               U32.pack(self.v_trans), U32.pack(self.n_layer)]
        out += [b for L in self.layers for b in (L.k_head, L.k.tobytes())]
        out += [b for L in self.layers for b in (L.v_head, L.v.tobytes())]
        return b"".join(out)


def join(parts: list[KvState]) -> KvState | None:
    """The layers of `parts`, in order, over the same cells (None if their cells differ)."""
    base = parts[0]
    for part in parts[1:]:
        if (part.meta, part.v_trans, part.prefix) != (base.meta, base.v_trans, base.prefix):
            return None
    return KvState(base.prefix, base.positions, base.meta, base.v_trans,
                   tuple(L for part in parts for L in part.layers))


def parse(blob: bytes) -> KvState | None:
    """The state in `blob`, or None when it is not laid out as the module says."""
    try:
        return _Reader(blob).state()
    except (struct.error, ValueError):
        return None


class _Reader:
    def __init__(self, blob: bytes):
        self.blob, self.at = memoryview(blob), 0

    def take(self, fmt: struct.Struct) -> int:
        (value,) = fmt.unpack_from(self.blob, self.at)
        self.at += fmt.size
        return value

    def raw(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.blob):
            raise ValueError("past the end")
        out = self.blob[self.at:self.at + n]
        self.at += n
        return out

    def state(self) -> KvState:
        prefix = bytes(self.raw(8))
        if self.take(U32) != 1:
            raise ValueError("not one stream")
        cells = self.take(U32)
        positions, meta = [], []
        for _ in range(cells):
            start = self.at
            positions.append(self.take(I32))
            self.raw(4 * self.take(U32))
            meta.append(bytes(self.blob[start:self.at]))
        v_trans, n_layer = self.take(U32), self.take(U32)
        if v_trans not in (0, 1):
            raise ValueError("v_trans")
        ks = [self._rows(cells) for _ in range(n_layer)]
        vs = [self._columns(cells) if v_trans else self._rows(cells) for _ in range(n_layer)]
        if self.at != len(self.blob):
            raise ValueError("bytes left over")
        layers = tuple(Layer(kh, k, vh, v) for (kh, k), (vh, v) in zip(ks, vs))
        return KvState(prefix, np.array(positions, dtype=np.int32), tuple(meta), v_trans, layers)

    def _rows(self, cells: int) -> tuple[bytes, np.ndarray]:
        head = bytes(self.raw(K_HEAD.size))
        _, row = K_HEAD.unpack(head)
        data = np.frombuffer(self.raw(cells * row), dtype=np.uint8).reshape(cells, row)
        return head, data

    def _columns(self, cells: int) -> tuple[bytes, np.ndarray]:
        head = bytes(self.raw(V_TRANS_HEAD.size))
        _, size, rows = V_TRANS_HEAD.unpack(head)
        data = np.frombuffer(self.raw(rows * cells * size), dtype=np.uint8)
        return head, data.reshape(rows, cells, size)
