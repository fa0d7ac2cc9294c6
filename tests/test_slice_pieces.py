"""A stage assembled from a cached slice and the piece it lacks (model/slice_pieces.py) is the
cut of its range byte for byte, on both real models' tensor orders (layers listed with their
numbers sorted as text); what cannot be assembled surely is refused; and through
weights.obtain under mpiexec, a rank with an old slice in its own cache receives only the
piece (or its whole slice, when its cached slice leaves more than one piece)."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from pipeinfer.model import stage_cache
from pipeinfer.model.models import ModelError
from pipeinfer.model.partition import StageRange as R
from pipeinfer.model.slice_pieces import (PieceError, assemble, find_pieces, merge, piece_of,
                                          refusal)
from pipeinfer.model.slicing import model_info, read_model, stage_size
from support import JOBS_DIR
from support.cached_models import cached_models
from support.mpi_util import PYTHON, launch, mpmd_command

# (old slice, new range) per model: the piece is what the old slice lacks of the new range.
CASES = {
    "qwen-coder-1.5b": [
        (R(1, 0, 11, False), R(1, 0, 17, False)),    # piece at the end, non-final
        (R(2, 23, 28, True), R(1, 17, 28, True)),    # piece at the front of a final range
        (R(1, 11, 23, False), R(1, 11, 28, True)),   # the piece is the final slice
        (R(2, 11, 23, False), R(1, 5, 23, False)),   # piece at the front, non-final
    ],
    "smollm2": [
        (R(1, 0, 11, False), R(1, 0, 17, False)),
        (R(2, 23, 30, True), R(1, 17, 30, True)),
        (R(1, 11, 23, False), R(1, 11, 30, True)),
        (R(2, 11, 23, False), R(1, 5, 23, False)),
        (R(1, 0, 9, False), R(1, 0, 12, False)),     # layers 9, 10, 11 around "10" < "9"
    ],
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A stage cache of this module's own (the cuts are reused by its cases)."""
    return tmp_path_factory.mktemp("pieces-cache")


@pytest.mark.slow
@pytest.mark.parametrize("name,old,new", [(n, o, w) for n, cases in CASES.items()
                                          for o, w in cases])
def test_assembled_equals_the_cut(name, old, new, cache, tmp_path, monkeypatch):
    (model,) = cached_models(name)
    monkeypatch.setenv("PIPEINFER_CACHE", str(cache))
    piece = piece_of(old, new)
    header = read_model(model)
    info = model_info(header, model)
    assert piece is not None and piece.final == (new.final and piece.last == new.last)
    assert refusal(header, info, old, piece, new) is None
    cut = stage_cache.stage_file(model, new)
    assert stage_size(header, info, new) == cut.stat().st_size
    out = tmp_path / "assembled.gguf"
    assemble(stage_cache.stage_file(model, old), old, stage_cache.stage_file(model, piece),
             piece, new, out)
    try:
        assert filecmp.cmp(out, cut, shallow=False)
    finally:
        out.unlink()
    assert [p.name for p in tmp_path.iterdir()] == []  # no temporary file left


@pytest.mark.smollm2
def test_parts_that_do_not_make_the_slice_fail_and_leave_nothing(tmp_path, monkeypatch):
    """A slice that is not the range it stands for, or a piece cut short: a clear error,
    and no file (nor temporary file) where the slice would have been."""
    (smollm2,) = cached_models("smollm2")
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path / "cache"))
    old, new = R(1, 0, 11, False), R(1, 0, 17, False)
    piece = piece_of(old, new)
    piece_file = stage_cache.stage_file(smollm2, piece)
    out = tmp_path / "out" / "assembled.gguf"
    out.parent.mkdir()
    with pytest.raises(PieceError, match="has 10 layers"):
        assemble(stage_cache.stage_file(smollm2, R(1, 0, 10, False)), old, piece_file, piece,
                 new, out)
    short = tmp_path / "short.gguf"
    short.write_bytes(piece_file.read_bytes()[:-4096])
    with pytest.raises(ModelError, match="truncated"):
        assemble(stage_cache.stage_file(smollm2, old), old, short, piece, new, out)
    assert list(out.parent.iterdir()) == []


def test_only_one_piece_on_one_side():
    new = R(1, 0, 17, False)
    assert piece_of(R(0, 0, 11, False), new) == R(1, 11, 17, False)
    assert piece_of(R(0, 3, 11, False), new) is None          # two pieces: [0,3) and [11,17)
    assert piece_of(R(0, 0, 17, False), new) is None          # nothing lacks
    assert piece_of(R(0, 0, 20, False), new) is None          # more than the new range
    assert piece_of(R(0, 17, 20, False), new) is None         # does not overlap
    assert piece_of(R(0, 11, 28, True), R(1, 5, 28, True)) == R(1, 5, 11, False)
    assert piece_of(R(0, 11, 23, False), R(1, 5, 23, True)) is None  # final flag differs


def _layout(layers: list[int], first: int, extra=(), lead=()) -> list:
    """A stage file's tensors: `layers` (source numbers, in file order) of a slice from
    `first`, two tensors each, between `lead` and `extra` tensors outside the layers."""
    rows = [(n, (4,), 0, (0, 4)) for n in lead]
    for layer in layers:
        rows += [(f"blk.{layer - first}.{t}", (4,), 0, (layer, 4)) for t in ("a", "b")]
    return rows + [(n, (4,), 0, (0, 4)) for n in extra]


def test_merge_orders_layers_as_both_parts_do():
    old, new = R(1, 0, 11, False), R(1, 0, 17, False)
    piece = piece_of(old, new)
    text_order = [0, 1, 10, 2, 3, 4, 5, 6, 7, 8, 9]
    merged = merge(_layout(text_order, 0, ["output_norm.weight"]), old,
                   _layout(range(11, 17), 11, ["output_norm.weight"]), piece, new)
    layers = [int(n.split(".")[1]) for n, *_ in merged if n.startswith("blk.")][::2]
    assert layers == [0, 1, 10, 11, 12, 13, 14, 15, 16, 2, 3, 4, 5, 6, 7, 8, 9]
    assert merged[-1][0] == "output_norm.weight" and merged[-1][3][0] == 0  # the old's


@pytest.mark.parametrize("old_layers,piece_layers,why", [
    ([9], [10], "cannot be told"),                  # 9 before 10, or "10" before "9"?
    ([0, 2, 1, 3, 4, 5, 6, 7, 8, 9, 10], list(range(11, 17)), "cannot be told"),  # neither
])
def test_an_order_that_cannot_be_told_is_refused(old_layers, piece_layers, why):
    first = min(old_layers)
    old = R(1, first, first + len(old_layers), False)
    new = R(1, first, old.last + len(piece_layers), False)
    with pytest.raises(PieceError, match=why):
        merge(_layout(old_layers, first), old, _layout(piece_layers, old.last),
              piece_of(old, new), new)


def test_a_tensor_among_the_layers_or_a_split_layer_is_refused():
    old, new = R(1, 0, 3, False), R(1, 0, 5, False)
    piece = piece_of(old, new)
    among = _layout([0], 0, ["output_norm.weight"]) + _layout([1, 2], 0)
    with pytest.raises(PieceError, match="outside the layers"):
        merge(among, old, _layout([3, 4], 3), piece, new)
    split = _layout([0, 1], 0) + _layout([2, 0], 0)
    with pytest.raises(PieceError, match="not together"):
        merge(split, old, _layout([3, 4], 3), piece, new)
    with pytest.raises(PieceError, match="not what"):
        merge(_layout([0, 1, 2], 0), old, _layout([3], 3), R(1, 3, 4, False), new)


def test_find_pieces_takes_the_smallest_piece(tmp_path, monkeypatch):
    (smollm2,) = cached_models("smollm2")
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path))
    digest = stage_cache.content_digest(smollm2)
    new = R(1, 0, 17, False)
    assert find_pieces(digest, new) is None
    for rng in (R(0, 0, 5, False), R(0, 3, 11, False), R(0, 0, 11, False)):
        stage_cache.stage_file(smollm2, rng)
    found = find_pieces(digest, new)
    assert found.old == R(0, 0, 11, False) and found.piece == R(1, 11, 17, False)
    assert find_pieces("0" * 64, new) is None                  # another model's slices


def test_rank0_refuses_what_would_not_be_the_cut():
    (smollm2,) = cached_models("smollm2")
    header = read_model(smollm2)
    info = model_info(header, smollm2)
    assert "not what" in refusal(header, info, R(1, 0, 11, False), R(1, 12, 17, False),
                                 R(1, 0, 17, False))
    assert "cannot be told" in refusal(header, info, R(1, 9, 10, False), R(1, 10, 11, False),
                                       R(1, 9, 11, False))


def _obtain(tmp_path: Path, model: Path, new: R, cached: R) -> dict:
    """weights.obtain under mpiexec, rank 1's own cache holding the slice `cached`."""
    caches = [tmp_path / "cache0", tmp_path / "cache1"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIPEINFER_CACHE", str(caches[1]))
        stage_cache.stage_file(model, cached)
    args = [str(PYTHON), str(JOBS_DIR / "pieces_job.py"), str(model), str(new.first),
            str(new.last), "final" if new.final else "-"]
    result = launch(mpmd_command([(1, ["env", f"PIPEINFER_CACHE={c}", *args])
                                  for c in caches]), timeout=120)
    assert result.rc == 0 and result.json is not None, result.describe()
    return {**result.json, "stderr": result.stderr, "caches": caches}


@pytest.mark.slow
@pytest.mark.smollm2
def test_obtain_sends_only_the_piece(tmp_path: Path):
    (smollm2,) = cached_models("smollm2")
    new = R(1, 0, 17, False)
    out = _obtain(tmp_path, smollm2, new, R(1, 0, 11, False))
    assert filecmp.cmp(out["path"], out["cut"], shallow=False)
    stages = out["caches"][1] / "stages"
    key = stage_cache.stage_key(stage_cache.content_digest(smollm2), R(1, 11, 17, False))
    piece_on_rank0 = out["caches"][0] / "stages" / f"{key}.gguf"
    assert out["received"] == piece_on_rank0.stat().st_size < Path(out["cut"]).stat().st_size
    assert not (stages / f"{key}.gguf").exists()  # the piece is not kept once assembled
    assert len(list(stages.glob("*.gguf"))) == 2  # the old slice and the new one
    assert "the whole slices would be" in out["stderr"], out["stderr"]


@pytest.mark.slow
@pytest.mark.smollm2
def test_obtain_sends_the_whole_slice_when_two_pieces_lack(tmp_path: Path):
    (smollm2,) = cached_models("smollm2")
    out = _obtain(tmp_path, smollm2, R(1, 0, 17, False), R(1, 3, 11, False))
    assert filecmp.cmp(out["path"], out["cut"], shallow=False)
    assert out["received"] == Path(out["cut"]).stat().st_size
