"""A stage file assembled from a cached slice and the piece it lacks, instead of received whole.

When a job is relaunched after a host is lost, the surviving ranks get layer ranges that extend
the ones they held (a 28-layer model's [0,11),[11,23),[23,28) become [0,17),[17,28)). A rank
whose stage cache holds the slice [a,b) of the same model (same content digest and slicer
version) for a range sharing one end with its new range [first,last) needs only the missing
piece ([b,last) or [first,a)) from rank 0: Qwen2.5 1.5B's [0,17) from [0,11) takes 165 MB
instead of 484 MB. This module joins the two files into the stage file of [first,last), byte
for byte what slicing.write_stage cuts from the model, and puts it in the stage cache under
its key.

What comes from where. Layer tensors come from the part that holds them, renumbered. The
metadata and the tensors outside the layers (output_norm, the output head, the final stage's
stand-in embeddings or a non-final stage's one-row zeros) come from the part that is final
exactly when the new range is (the "provider"): the old slice, unless the old slice is
[first,a) and the new range final, whose piece [a,last) is then cut as a final slice. Its
metadata is the new file's with `{arch}.block_count` replaced.

The order of the tensors. A stage keeps its model's tensor order, and the layers' order is
not in their names: common GGUF files list them with the layer numbers sorted as text (0, 1,
10, 11, ..., 19, 2, 20, ...). Each part shows the order of its own layers; the merge sorts
them by the one key (number, or number as text) that agrees with both parts' orders, and
refuses if none does or both do with different results. A part whose layer tensors are not in
one run per layer, or have other tensors among them, is refused too. Rank 0, which has the
model, runs the same merge on the layouts the two parts have (they are cuts of its model) and
compares the result with the cut of the new range (`refusal`): a rank is sent a piece only
when the assembly gives the cut; otherwise it is sent its whole slice as before.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from gguf import Keys

from .gguf_header import Header
from .models import ModelError, checked_header, locked
from .partition import StageRange
from .slicing import ModelInfo, SliceError, kv_key, kv_uint32, stage_kvs, stage_tensors, \
    write_gguf
from .stage_cache import cached_slices, stages_dir

log = logging.getLogger(__name__)

_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(.+)$")
# Orders a model's layers may be listed in (each part's own order decides which applies).
_LAYER_ORDERS = {"by number": lambda layer: layer, "by number as text": str}


class PieceError(SliceError):
    """A stage cannot be assembled from these parts; the message says why."""


@dataclass(frozen=True)
class Pieces:
    """A rank's cached slice `old` (at `path` on its disk) and the `piece` it lacks of `new`."""
    old: StageRange
    piece: StageRange
    path: str


def piece_of(old: StageRange, new: StageRange) -> StageRange | None:
    """The one piece that `old` lacks of `new`, if `old` lies inside `new` sharing one end with
    it (None otherwise); the piece is final when it ends a final range."""
    if old.n_layer <= 0:
        return None
    if old.first == new.first and old.last < new.last and not old.final:
        return StageRange(new.rank, old.last, new.last, new.final)
    if old.last == new.last and old.first > new.first and old.final == new.final:
        return StageRange(new.rank, new.first, old.first, False)
    return None


def old_provides(old: StageRange, new: StageRange) -> bool:
    """Whether the old slice (else the piece) gives the new stage's metadata and the tensors
    outside the layers: the part that is final exactly when the new range is."""
    return old.final == new.final


def find_pieces(model_digest: str, new: StageRange) -> Pieces | None:
    """The cached slice of the model that leaves the smallest piece of `new` to receive, if
    any (a slice whose file is not whole is passed over)."""
    best = None
    for old, path in cached_slices(model_digest):
        piece = piece_of(old, new)
        if piece is None or (best is not None and best.piece.n_layer <= piece.n_layer):
            continue
        try:
            checked_header(path)
        except ModelError as err:
            log.warning("cached slice %s is not usable (%s): passed over", path.name, err)
            continue
        best = Pieces(old, piece, str(path))
    return best


@dataclass
class _Part:
    """One part's tensors split around its layers; layer groups by source layer number."""
    leading: list = field(default_factory=list)
    groups: list = field(default_factory=list)     # (source layer, [tensors]) in file order
    trailing: list = field(default_factory=list)


def merge(old_layout: list, old: StageRange, piece_layout: list, piece: StageRange,
          new: StageRange) -> list:
    """The new stage's tensors (name, dims, type, (part, data)) in its order, from the parts'
    tensors (name, dims, type, data) in file order (part 0: the old slice, 1: the piece).
    Raises PieceError if the order cannot be told (see the module's docstring)."""
    if piece_of(old, new) != piece:
        raise PieceError(f"layers [{piece.first}, {piece.last}) are not what [{old.first}, "
                         f"{old.last}) lacks of [{new.first}, {new.last})")
    parts = [_split(old_layout, old, new, 0), _split(piece_layout, piece, new, 1)]
    provider = parts[0 if old_provides(old, new) else 1]
    layers = [t for _, tensors in _merged_groups(parts) for t in tensors]
    return provider.leading + layers + provider.trailing


def _split(layout: list, rng: StageRange, new: StageRange, part: int) -> _Part:
    """`layout`'s tensors before, in and after its layers, layers renumbered for `new`."""
    out = _Part()
    for name, dims, ttype, data in layout:
        m = _BLOCK_NAME.match(name)
        if m is None:
            (out.trailing if out.groups else out.leading).append((name, dims, ttype,
                                                                  (part, data)))
            continue
        layer = rng.first + int(m.group(1))
        if out.trailing:
            raise PieceError(f"{name} follows {out.trailing[0][0]}, a tensor outside the "
                             "layers: where it goes in the new stage is unknown")
        if not rng.first <= layer < rng.last:
            raise PieceError(f"{name} is outside layers [{rng.first}, {rng.last})")
        if not out.groups or out.groups[-1][0] != layer:
            if any(g[0] == layer for g in out.groups):
                raise PieceError(f"the tensors of layer {layer} are not together")
            out.groups.append((layer, []))
        out.groups[-1][1].append((f"blk.{layer - new.first}.{m.group(2)}", dims, ttype,
                                  (part, data)))
    if len(out.groups) != rng.n_layer:
        raise PieceError(f"layers [{rng.first}, {rng.last}): {len(out.groups)} layers found")
    return out


def _merged_groups(parts: list[_Part]) -> list:
    """Both parts' layer groups in the one order that agrees with each part's own."""
    merged = {}
    for label, key in _LAYER_ORDERS.items():
        if all([g[0] for g in p.groups] == sorted((g[0] for g in p.groups), key=key)
               for p in parts):
            merged[label] = sorted((g for p in parts for g in p.groups), key=lambda g: key(g[0]))
    if len({tuple(g[0] for g in groups) for groups in merged.values()}) != 1:
        raise PieceError("the order of the layers cannot be told from the parts (ordered "
                         f"{', '.join(merged) or 'neither by number nor as text'})")
    return next(iter(merged.values()))


def with_block_count(kvs: list[bytes], arch: str, n_layer: int) -> list[bytes]:
    """Metadata entries (whole, as bytes) with `{arch}.block_count` set to `n_layer`."""
    key = kv_key(Keys.LLM.BLOCK_COUNT.format(arch=arch))
    if sum(kv.startswith(key) for kv in kvs) != 1:
        raise PieceError(f"not one {arch}.block_count entry in the metadata")
    return [key + kv_uint32(n_layer) if kv.startswith(key) else kv for kv in kvs]


def refusal(header: Header, info: ModelInfo, old: StageRange, piece: StageRange,
            new: StageRange) -> str | None:
    """Rank 0, which has the model (`header`): why assembling `new` from the slice `old` and
    `piece` would not give the cut of `new` (None: it would, byte for byte). Runs the merge
    on the layouts the two parts have, without writing anything."""
    try:
        tensors = merge(stage_tensors(header, info, old), old,
                        stage_tensors(header, info, piece), piece, new)
        if [(n, d, t, data) for n, d, t, (_, data) in tensors] != \
                stage_tensors(header, info, new):
            return "the assembled tensors would not be the cut's"
        provider = old if old_provides(old, new) else piece
        with open(header.path, "rb") as handle, \
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            def raw(kvs):
                return [bytes(buf[kv[0]:kv[1]]) if isinstance(kv, tuple) else kv for kv in kvs]
            kvs = with_block_count(raw(stage_kvs(header, info, provider)), info.arch,
                                   new.n_layer)
            if kvs != raw(stage_kvs(header, info, new)):
                return "the assembled metadata would not be the cut's"
    except (PieceError, OSError, ValueError) as err:
        return str(err)
    return None


def assemble(old_path: Path, old: StageRange, piece_path: Path, piece: StageRange,
             new: StageRange, dst: Path) -> None:
    """Write the stage file of `new` to `dst` from the slice `old` and `piece` (stage files
    of the same model); written to a temporary name, checked, then renamed. PieceError if
    the parts do not make it."""
    headers = [checked_header(old_path), checked_header(piece_path)]
    _check_parts(headers, (old, piece))
    p = 0 if old_provides(old, new) else 1
    provider = headers[p]
    tensors = merge(_layout(headers[0]), old, _layout(headers[1]), piece, new)
    tensors = [(n, d, t, (part, *span)) for n, d, t, (part, span) in tensors]
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    try:
        with ExitStack() as stack:
            bufs = [stack.enter_context(_mapped(h.path)) for h in headers]
            kvs = with_block_count([bytes(bufs[p][s:e]) for s, e in provider.kv_spans.values()],
                                   provider.fields[Keys.General.ARCHITECTURE], new.n_layer)
            with open(tmp, "wb") as out:
                write_gguf(out, bufs, kvs, tensors, provider.alignment, lambda i: None)
        _check_result(tmp, provider, tensors, new)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _layout(header: Header) -> list:
    """A file's tensors as (name, dims, type, (offset, size)), in file order."""
    return [(t.name, t.shape, t.ggml_type, (t.offset, t.n_bytes))
            for t in header.tensors.values()]


def _mapped(path: str) -> mmap.mmap:
    with open(path, "rb") as handle:
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def _check_parts(headers: list[Header], ranges: tuple) -> None:
    """PieceError unless each header is a stage file of its range's length, both of one
    architecture and alignment (as cuts of one model are)."""
    archs = {h.fields.get(Keys.General.ARCHITECTURE) for h in headers}
    if len(archs) != 1 or len({h.alignment for h in headers}) != 1:
        raise PieceError("the cached slice and the piece differ in architecture or alignment")
    for header, rng in zip(headers, ranges):
        count = header.fields.get(Keys.LLM.BLOCK_COUNT.format(arch=next(iter(archs))))
        if count != rng.n_layer:
            raise PieceError(f"{Path(header.path).name} has {count} layers, not the "
                             f"{rng.n_layer} of [{rng.first}, {rng.last})")


def _check_result(path: Path, provider: Header, tensors: list, new: StageRange) -> None:
    """PieceError unless the written file parses whole with the planned tensors and layers."""
    header = checked_header(path)
    arch = provider.fields[Keys.General.ARCHITECTURE]
    planned = [(n, tuple(d), t) for n, d, t, _ in tensors]
    if [(t.name, t.shape, t.ggml_type) for t in header.tensors.values()] != planned or \
            header.fields.get(Keys.LLM.BLOCK_COUNT.format(arch=arch)) != new.n_layer:
        raise PieceError(f"the assembled {path.name} is not the stage file planned")


def assemble_cached(pieces: Pieces, piece_path: Path, new: StageRange, key: str) -> Path:
    """The stage file of `new` assembled into the stage cache under `key` from the cached
    slice and the received piece. The piece is deleted either way: the new slice holds its
    layers, no plan asks for it, and it would only take the disk space of those layers a
    second time. The old slice stays: a plan may ask for it again (the lost host back)."""
    dst = stages_dir() / f"{key}.gguf"
    try:
        with locked(stages_dir() / f"{key}.lock"):
            if not dst.exists():
                assemble(Path(pieces.path), pieces.old, piece_path, pieces.piece, new, dst)
                log.info("assembled layers [%d, %d) from its cached [%d, %d) and the piece "
                         "[%d, %d) received", new.first, new.last, pieces.old.first,
                         pieces.old.last, pieces.piece.first, pieces.piece.last)
    finally:
        piece_path.unlink(missing_ok=True)
    return dst
