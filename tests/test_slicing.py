"""Stage files: their layout, every refusal with its message, `pipeinfer split` end to end, and
the content-keyed stage cache under concurrent use."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from pipeinfer.model import stage_cache
from pipeinfer.model.models import ModelError
from pipeinfer.model.partition import StageRange, partition
from pipeinfer.model.slicing import (SliceError, model_info, open_model, read_model, split_model,
                               write_stage)
from support.tinymodel import copy_gguf

PIPEINFER = Path(sys.executable).with_name("pipeinfer")


def _value(reader: GGUFReader, key: str):
    field = reader.get_field(key)
    return None if field is None else field.contents()


def _metadata(reader: GGUFReader) -> dict:
    return {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}


def _tensors(reader: GGUFReader) -> dict:
    return {t.name: t for t in reader.tensors}


def rewrite(src: Path, dst: Path, *, arch: str | None = None, extra: dict | None = None,
            alignment: int | None = None) -> Path:
    """Copy GGUF `src` to `dst`, optionally renaming the architecture (and its keys), adding
    metadata {key: (value, type)} or setting a data alignment."""
    return copy_gguf(src, dst, arch=arch, extra=extra, alignment=alignment)


# --- stage file layout -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def split3(tiny_model: Path, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("split3")
    manifest = split_model(tiny_model, partition(4, [0.25, 0.25, 0.5]), out)
    return out, json.loads(manifest.read_text())


def test_manifest(tiny_model: Path, split3):
    out, m = split3
    assert m["source"] == str(tiny_model.resolve())
    assert (m["arch"], m["n_layer"], m["n_embd"]) == ("llama", 4, 64)
    assert [(s["rank"], s["first"], s["last"], s["final"], s["file"]) for s in m["stages"]] == [
        (0, 0, 1, False, "stage-00.gguf"), (1, 1, 2, False, "stage-01.gguf"),
        (2, 2, 4, True, "stage-02.gguf")]
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json", "stage-00.gguf", "stage-01.gguf", "stage-02.gguf"]  # no temporaries


def check_stage_file(src: GGUFReader, path: Path, first: int, last: int, final: bool) -> None:
    """A stage file holds exactly: the source's metadata (tokenizer dropped: a "none" model of
    the source's vocabulary size if final, else of one row), block_count = last - first, the source's blocks [first, last)
    renumbered from 0 with identical bytes, and the non-block tensors (zeros of shape
    [1, n_embd] for token_embd/output unless final)."""
    st = GGUFReader(path)
    src_meta, st_meta = _metadata(src), _metadata(st)
    n_embd = src_meta["llama.embedding_length"]
    assert st_meta.pop("llama.block_count") == last - first
    src_meta.pop("llama.block_count")
    assert st_meta.pop("tokenizer.ggml.model") == "none"   # rank 0 tokenizes, no stage
    n_vocab = len(src.fields["tokenizer.ggml.tokens"].data)
    assert st_meta.pop("llama.vocab_size") == (n_vocab if final else 1)
    assert not [k for k in st_meta if k.startswith("tokenizer.")]
    assert st_meta == {k: v for k, v in src_meta.items()
                       if not k.startswith("tokenizer.") and k != "llama.vocab_size"}
    src_t, st_t = _tensors(src), _tensors(st)
    expected = set()
    for name, t in src_t.items():
        if name.startswith("blk."):
            layer, rest = name.split(".", 2)[1:]
            if first <= int(layer) < last:
                expected.add(f"blk.{int(layer) - first}.{rest}")
        else:
            expected.add(name)
    if final and "output.weight" in src_t:  # the output head under the embeddings' name
        expected.discard("output.weight")
    assert set(st_t) == expected
    for name, t in st_t.items():
        if name.startswith("blk."):
            layer, rest = name.split(".", 2)[1:]
            s = src_t[f"blk.{int(layer) + first}.{rest}"]
        else:
            s = src_t[name]
        if not final and name in ("token_embd.weight", "output.weight"):
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            assert list(t.shape) == [n_embd, 1]
            assert not np.any(t.data)
            continue
        if final and name == "token_embd.weight" and "output.weight" in src_t:
            s = src_t["output.weight"]  # a llama: llama.cpp ties a missing head to it
        assert t.tensor_type == s.tensor_type and list(t.shape) == list(s.shape), name
        assert np.array_equal(np.asarray(t.data).view(np.uint8), np.asarray(s.data).view(np.uint8))


def test_stage_files(tiny_model: Path, split3):
    out, m = split3
    src = GGUFReader(tiny_model)
    for s in m["stages"]:
        check_stage_file(src, out / s["file"], s["first"], s["last"], s["final"])
    # what llama.cpp is told: a non-final stage has a vocabulary of one row
    assert model_info(read_model(out / "stage-00.gguf"), "s0").n_vocab == 1
    assert model_info(read_model(out / "stage-02.gguf"), "s2").n_vocab == \
        model_info(read_model(tiny_model), "src").n_vocab



def test_stage_files_hold_no_tokenizer_unless_kept(tiny_model: Path, split3, tmp_path: Path):
    """Rank 0 tokenizes from the model file; a stage file asked for a tokenizer is one clear
    error (llama.cpp would abort the process), and keep_tokenizer makes the first layers a
    model of their own (a smaller draft) that tokenizes as the source does."""
    from pipeinfer.model.llama_lib import LlamaError
    from pipeinfer.model.tokenizer import Tokenizer

    out, _ = split3
    with pytest.raises(LlamaError, match="has no tokenizer"):
        Tokenizer(out / "stage-02.gguf")
    first2 = tmp_path / "first2.gguf"
    write_stage(open_model(tiny_model), model_info(read_model(tiny_model), tiny_model),
                StageRange(0, 0, 2, True), first2, keep_tokenizer=True)
    text = "the number of people in the world"
    assert Tokenizer(first2).tokenize(text) == Tokenizer(tiny_model).tokenize(text)
    assert _metadata(GGUFReader(first2))["tokenizer.ggml.model"] != "none"

def test_head_without_layers_writes_no_file(tiny_model: Path, tmp_path: Path):
    m = json.loads(split_model(tiny_model, partition(4, [0, 0.5, 0.5]), tmp_path).read_text())
    assert [(s["first"], s["last"], s["file"]) for s in m["stages"]] == [
        (0, 0, None), (0, 2, "stage-01.gguf"), (2, 4, "stage-02.gguf")]
    assert not (tmp_path / "stage-00.gguf").exists()


def test_single_stage_is_whole_model(tiny_model: Path, tmp_path: Path):
    split_model(tiny_model, partition(4, [1.0]), tmp_path)
    check_stage_file(GGUFReader(tiny_model), tmp_path / "stage-00.gguf", 0, 4, True)


def test_write_stage_sources_agree(tiny_model: Path, tmp_path: Path):
    """write_stage takes the parsed header (open_model) or a gguf.GGUFReader: same bytes."""
    info = model_info(open_model(tiny_model), tiny_model)
    for stage in [StageRange(0, 0, 2, False), StageRange(1, 2, 4, True)]:
        a, b = tmp_path / f"a{stage.rank}.gguf", tmp_path / f"b{stage.rank}.gguf"
        write_stage(open_model(tiny_model), info, stage, a)
        write_stage(GGUFReader(tiny_model), info, stage, b)
        assert a.read_bytes() == b.read_bytes()


def test_custom_alignment_kept(tiny_model: Path, tmp_path: Path):
    src = rewrite(tiny_model, tmp_path / "aligned64.gguf", alignment=64)
    split_model(src, partition(4, [0.5, 0.5]), tmp_path / "out")
    reader = GGUFReader(src)
    for name, (first, last, final) in [("stage-00.gguf", (0, 2, False)),
                                       ("stage-01.gguf", (2, 4, True))]:
        path = tmp_path / "out" / name
        st = GGUFReader(path)
        assert _value(st, "general.alignment") == 64
        assert all(t.data_offset % 64 == 0 for t in st.tensors)
        check_stage_file(reader, path, first, last, final)


# --- refusals --------------------------------------------------------------------------------

def _refusals(path: Path) -> list:
    """Every entry point that must refuse `path`, as zero-argument callables."""
    return [lambda: open_model(path), lambda: read_model(path),
            lambda: split_model(path, partition(4, [0.5, 0.5]), path.parent / "out")]


def test_refuse_non_gguf(tmp_path: Path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip file, not a model" * 10)
    for call in _refusals(bad):
        with pytest.raises(ModelError, match=r"model.gguf is not a GGUF file"):
            call()
    assert not (tmp_path / "out").exists()


def test_refuse_missing(tmp_path: Path):
    with pytest.raises(ModelError, match="model file not found"):
        open_model(tmp_path / "nope.gguf")


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.02])
def test_refuse_truncated(tiny_model: Path, tmp_path: Path, keep: float):
    """Cut in the tensor data (0.5, 0.999) or inside the metadata (0.02)."""
    data = tiny_model.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(len(data) * keep)])
    for call in _refusals(cut):
        with pytest.raises(ModelError, match=r"cut.gguf.* truncated"):
            call()


def test_refuse_other_architecture(tiny_model: Path, tmp_path: Path):
    gemma = rewrite(tiny_model, tmp_path / "gemma.gguf", arch="gemma3")
    msg = (r"architecture 'gemma3' is not supported for layer slicing \(its layers may differ by "
           r"index\); supported: .*llama")
    for call in [lambda: model_info(read_model(gemma), gemma),
                 lambda: model_info(open_model(gemma), gemma),
                 lambda: split_model(gemma, partition(4, [0.5, 0.5]), tmp_path / "out")]:
        with pytest.raises(SliceError, match=msg):
            call()
    assert not (tmp_path / "out").exists()


def test_refuse_per_layer_differences(tiny_model: Path, tmp_path: Path):
    key = "llama.attention.sliding_window_pattern"
    odd = rewrite(tiny_model, tmp_path / "odd.gguf",
                  extra={key: ([1, 1, 1, 0], GGUFValueType.ARRAY)})
    msg = rf"per-layer hyperparameter {key} differs between layers; slicing such models is not"
    for call in [lambda: model_info(read_model(odd), odd),
                 lambda: model_info(open_model(odd), odd),
                 lambda: split_model(odd, partition(4, [0.5, 0.5]), tmp_path / "out")]:
        with pytest.raises(SliceError, match=msg):
            call()
    # the same array with one value for every layer is fine
    even = rewrite(tiny_model, tmp_path / "even.gguf",
                   extra={key: ([1, 1, 1, 1], GGUFValueType.ARRAY)})
    assert model_info(read_model(even), even).n_layer == 4


def test_refuse_missing_metadata(tiny_model: Path, tmp_path: Path):
    reader = GGUFReader(tiny_model)
    writer = GGUFWriter(tmp_path / "nobc.gguf", "llama")
    for f in reader.fields.values():
        if f.name in ("general.architecture", "llama.block_count") or f.name.startswith("GGUF."):
            continue
        vtype = f.types[0]
        writer.add_key_value(f.name, f.contents(), vtype,
                             sub_type=f.types[-1] if vtype == GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(SliceError, match="GGUF metadata key llama.block_count is missing"):
        model_info(read_model(tmp_path / "nobc.gguf"), tmp_path / "nobc.gguf")


def test_refuse_split_not_covering_model(tiny_model: Path, tmp_path: Path):
    with pytest.raises(SliceError, match="the split covers 3 layers but the model has 4"):
        split_model(tiny_model, partition(3, [0.5, 0.5]), tmp_path)


# --- `pipeinfer split` -----------------------------------------------------------------------

def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(PIPEINFER), *args], capture_output=True, text=True, timeout=120)


def test_cli_split(tiny_model: Path, tmp_path: Path):
    out = tmp_path / "stages"
    res = run_cli("split", "-m", str(tiny_model), "--layer-split", "0.25,0.25,0.5", "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "rank 0: layers [0, 1)", "rank 1: layers [1, 2)", "rank 2: layers [2, 4) final",
        f"wrote {out / 'manifest.json'}"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["source"] == str(tiny_model.resolve()) and m["n_layer"] == 4
    assert [(s["first"], s["last"], s["final"]) for s in m["stages"]] == [
        (0, 1, False), (1, 2, False), (2, 4, True)]
    src = GGUFReader(tiny_model)
    n_vocab = _value(src, "llama.vocab_size")
    for s, name in zip(m["stages"], ["stage-00.gguf", "stage-01.gguf", "stage-02.gguf"]):
        assert s["file"] == name
        reader = GGUFReader(out / name)
        assert _value(reader, "llama.block_count") == s["last"] - s["first"]
        assert _value(reader, "llama.vocab_size") == (n_vocab if s["final"] else 1)
        embd = _tensors(reader)["token_embd.weight"]
        assert int(embd.shape[1]) == (n_vocab if s["final"] else 1)
        check_stage_file(src, out / name, s["first"], s["last"], s["final"])


def test_cli_split_head_without_layers(tiny_model: Path, tmp_path: Path):
    res = run_cli("split", "-m", str(tiny_model), "--layer-split", "0,0.5,0.5", "-o", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[:3] == [
        "rank 0: layers [0, 0)", "rank 1: layers [0, 2)", "rank 2: layers [2, 4) final"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json", "stage-01.gguf", "stage-02.gguf"]


@pytest.mark.parametrize("split, message", [
    ("0.5,0.4", "layer split fractions sum to 0.9, not 1"),
    ("0.2,0.2,0.2,0.2,0.2", "5 ranks but the model has only 4 layers"),
    ("0.5,0.01,0.49", "gives rank 1 no layers of 4"),
])
def test_cli_split_refusals(tiny_model: Path, tmp_path: Path, split: str, message: str):
    res = run_cli("split", "-m", str(tiny_model), "--layer-split", split, "-o", str(tmp_path / "o"))
    assert res.returncode == 1
    assert res.stderr.strip() == f"pipeinfer: error: {message}" or message in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "o").exists()


def test_cli_split_bad_values(tiny_model: Path, tmp_path: Path):
    res = run_cli("split", "-m", str(tiny_model), "--layer-split", "-0.5,1.5", "-o", str(tmp_path))
    assert res.returncode == 2 and "fractions must be finite and non-negative" in res.stderr
    res = run_cli("split", "-m", str(tmp_path / "nope.gguf"), "--layer-split", "1", "-o",
                  str(tmp_path))
    assert res.returncode == 1 and "model file not found" in res.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_text("hello")
    res = run_cli("split", "-m", str(junk), "--layer-split", "1", "-o", str(tmp_path / "o"))
    assert res.returncode == 1 and "is not a GGUF file" in res.stderr
    assert "Traceback" not in res.stderr


# --- stage cache -----------------------------------------------------------------------------

_CACHE_CHILD = """
import hashlib, os, sys, time
from pipeinfer.model.partition import StageRange
from pipeinfer.model.stage_cache import stage_file
go = sys.argv[2]
print("READY", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
path = stage_file(sys.argv[1], StageRange(1, 1, 3, False), progress=lambda m: print("WROTE", m))
print("PATH", path)
print("SHA", hashlib.sha256(path.read_bytes()).hexdigest())
"""


def test_stage_cache_concurrent(tiny_model: Path, tmp_path: Path, monkeypatch):
    cache = tmp_path / "cache"
    env = {**os.environ, "PIPEINFER_CACHE": str(cache)}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _CACHE_CHILD, str(tiny_model), str(go)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:  # both have imported pipeinfer and wait for the start signal
        assert p.stdout.readline().strip() == "READY", p.stderr.read()
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    lines = [dict(line.split(" ", 1) for line in out.splitlines()) for out, _ in outs]
    assert lines[0]["PATH"] == lines[1]["PATH"]
    assert lines[0]["SHA"] == lines[1]["SHA"]
    assert sum("WROTE" in d for d in lines) == 1  # exactly one process sliced the model
    path = Path(lines[0]["PATH"])
    assert path.parent == cache / "stages"
    assert not [p for p in path.parent.iterdir() if ".tmp" in p.name]
    check_stage_file(GGUFReader(tiny_model), path, 1, 3, False)

    # a later request is a no-op: same file, untouched
    monkeypatch.setenv("PIPEINFER_CACHE", str(cache))
    mtime = path.stat().st_mtime_ns
    time.sleep(0.01)
    said = []
    again = stage_cache.stage_file(tiny_model, StageRange(1, 1, 3, False), progress=said.append)
    assert again == path and path.stat().st_mtime_ns == mtime and said == []
    # a different range, or the final flag, is a different file
    final = stage_cache.stage_file(tiny_model, StageRange(2, 1, 4, True))
    assert final != path and final.parent == path.parent
    check_stage_file(GGUFReader(tiny_model), final, 1, 4, True)


def test_stage_cache_matches_split(tiny_model: Path, split3, monkeypatch, tmp_path: Path):
    """The cache writes the same bytes as `pipeinfer split` for the same range."""
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path))
    out, m = split3
    for s in m["stages"]:
        cached = stage_cache.stage_file(tiny_model, StageRange(s["rank"], s["first"], s["last"],
                                                               s["final"]))
        assert hashlib.sha256(cached.read_bytes()).digest() == \
            hashlib.sha256((out / s["file"]).read_bytes()).digest()


def test_stage_cache_default_is_session_cache(tiny_model: Path, session_cache: Path):
    """Tests never write stage files into the user's cache (see conftest.py)."""
    path = stage_cache.stage_file(tiny_model, StageRange(0, 0, 2, False))
    assert path.parent == session_cache / "stages"


def test_stage_cache_unwritable(tiny_model: Path, tmp_path: Path, monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root can write anywhere")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    monkeypatch.setenv("PIPEINFER_CACHE", str(ro))
    with pytest.raises(ModelError, match="is not writable"):
        stage_cache.stage_file(tiny_model, StageRange(0, 0, 2, False))


def test_final_stage_of_other_archs_zeroes_its_embeddings(tiny_model: Path):
    """Where llama.cpp is not known to tie a missing output head to the embeddings, a final
    stage keeps output.weight and gets zeroed embeddings of the smallest type that fits."""
    import dataclasses

    from pipeinfer.model.partition import StageRange
    from pipeinfer.model.slicing import stage_tensors, model_info, read_model

    header = read_model(tiny_model)
    info = dataclasses.replace(model_info(header, tiny_model), arch="not-tied")
    tensors = {name: (dims, ttype, data) for name, dims, ttype, data in
               stage_tensors(header, info, StageRange(1, 1, 2, True))}
    source = header.tensors["token_embd.weight"]
    dims, ttype, data = tensors["token_embd.weight"]
    assert list(dims) == list(source.shape) and ttype != source.ggml_type
    assert isinstance(data, bytes) and not any(data) and len(data) < source.n_bytes
    assert tensors["output.weight"][2] == (header.tensors["output.weight"].offset,
                                           header.tensors["output.weight"].n_bytes)
