"""Tests for support.tinymodel (the tests' models): tiny random llama GGUFs loaded by real llama.cpp."""

from pathlib import Path

import gguf
import numpy as np
import pytest

import llama_cpp
from support import tinymodel as tm

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "def main():\n    return"]
N_GEN = 64


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tinymodel")


@pytest.fixture(scope="module")
def target_path(model_dir: Path) -> Path:
    return tm.write_tiny_llama(model_dir / "target.gguf")


def _load(path: Path, logits_all: bool = False) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False, logits_all=logits_all)


@pytest.fixture(scope="module")
def target(target_path: Path) -> llama_cpp.Llama:
    return _load(target_path)


def greedy(llm: llama_cpp.Llama, prompt_ids: list[int], n: int) -> list[int]:
    """n greedily generated tokens (EOS included: it does not stop generation here)."""
    out: list[int] = []
    for tok in llm.generate(prompt_ids, temp=0.0, reset=True):
        out.append(tok)
        if len(out) == n:
            break
    return out


@pytest.fixture(scope="module")
def reference(target: llama_cpp.Llama) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target's greedy continuation) for each prompt."""
    refs = []
    for p in PROMPTS:
        ids = target.tokenize(p.encode())
        refs.append((ids, greedy(target, ids, N_GEN)))
    return refs


def teacher_forced_agreement(draft_path: Path, refs) -> float:
    """Fraction of positions where the draft's greedy choice, given the target's prefix,
    equals the target's greedy token (the speculative-decoding acceptance criterion)."""
    draft = _load(draft_path, logits_all=True)
    hits = []
    for ids, gen in refs:
        draft.reset()
        draft.eval(ids + gen)
        preds = np.argmax(draft.scores[len(ids) - 1: len(ids) - 1 + len(gen)], axis=1)
        hits.extend(int(a) == b for a, b in zip(preds, gen))
    return float(np.mean(hits))


def test_generates_non_degenerately(target: llama_cpp.Llama, reference) -> None:
    assert target.n_vocab() == len(tm.build_tokenizer()[0])
    for _, gen in reference:
        assert len(set(gen[:32])) >= 8, gen[:32]
    out = target.create_completion(PROMPTS[0], max_tokens=32, temperature=0)
    assert out["usage"]["completion_tokens"] >= 1
    # the completion API and our greedy loop agree on the continuation
    assert out["choices"][0]["text"] == target.detokenize(reference[0][1][:32]).decode(errors="ignore")[
        : len(out["choices"][0]["text"])]


@pytest.mark.parametrize("text", [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. It was the best of times.",
    "def main():\n    return [x * 2 for x in range(10)]  # comment\n",
    "".join(chr(c) for c in range(32, 127)),
    "tabs\tand\nnewlines\r\n  double  spaces ",
])
def test_tokenizer_roundtrips_ascii(target: llama_cpp.Llama, text: str) -> None:
    ids = target.tokenize(text.encode(), add_bos=False)
    assert target.detokenize(ids).decode() == text


def test_tokenizer_uses_merges_and_special_tokens(target: llama_cpp.Llama) -> None:
    text = b"the people would like to know what this is about"
    ids = target.tokenize(text, add_bos=False)
    assert len(ids) < len(text) / 2  # merges learned from the word list are applied
    tokens, merges, _ = tm.build_tokenizer()
    assert 200 <= len(merges) and 400 <= len(tokens) < 1000
    assert target.token_bos() == tokens.index(tm.BOS)
    assert target.token_eos() == tokens.index(tm.EOS)
    assert target.tokenize(b"hi", add_bos=True)[0] == target.token_bos()
    assert target.tokenize(tm.IM_START.encode(), add_bos=False, special=True) == [tokens.index(tm.IM_START)]


def test_chat_template(target: llama_cpp.Llama) -> None:
    assert target.metadata[gguf.Keys.Tokenizer.CHAT_TEMPLATE] == tm.CHAT_TEMPLATE
    out = target.create_chat_completion([{"role": "user", "content": "hi"}], max_tokens=4, temperature=0)
    assert out["choices"][0]["message"]["role"] == "assistant"


def test_files_are_deterministic(model_dir: Path, target_path: Path) -> None:
    again = tm.write_tiny_llama(model_dir / "again.gguf")
    assert again.read_bytes() == target_path.read_bytes()
    other = tm.write_tiny_llama(model_dir / "other.gguf", seed=1)
    assert other.read_bytes() != target_path.read_bytes()
    a = tm.write_noisy_copy(target_path, model_dir / "na.gguf", noise=0.05, seed=3)
    b = tm.write_noisy_copy(target_path, model_dir / "nb.gguf", noise=0.05, seed=3)
    assert a.read_bytes() == b.read_bytes() != target_path.read_bytes()
    same = tm.write_noisy_copy(target_path, model_dir / "n0.gguf", noise=0.0, seed=3)
    assert same.read_bytes() == target_path.read_bytes()
    u1, u2 = (tm.write_unrelated(model_dir / f"u{i}.gguf", seed=0) for i in (1, 2))
    assert u1.read_bytes() == u2.read_bytes() != target_path.read_bytes()


def test_noisy_copy_keeps_metadata_and_scales_noise(model_dir: Path, target_path: Path) -> None:
    src = gguf.GGUFReader(target_path)
    dst = gguf.GGUFReader(tm.write_noisy_copy(target_path, model_dir / "n1.gguf", noise=0.1, seed=0))
    assert [(f.name, f.types, f.contents()) for f in src.fields.values()] == \
        [(f.name, f.types, f.contents()) for f in dst.fields.values()]
    assert [(t.name, t.tensor_type, list(t.shape)) for t in src.tensors] == \
        [(t.name, t.tensor_type, list(t.shape)) for t in dst.tensors]
    for s, d in zip(src.tensors, dst.tensors):
        diff = np.asarray(d.data) - np.asarray(s.data)
        assert diff.std() == pytest.approx(0.1 * np.asarray(s.data).std(), rel=0.1, abs=1e-7), s.name


def test_unrelated_has_same_shapes(model_dir: Path, target_path: Path) -> None:
    src = gguf.GGUFReader(target_path)
    unrel = gguf.GGUFReader(tm.write_unrelated(model_dir / "unrel.gguf", seed=0))
    assert [(t.name, list(t.shape)) for t in src.tensors] == [(t.name, list(t.shape)) for t in unrel.tensors]
    assert src.fields[gguf.Keys.Tokenizer.LIST].contents() == unrel.fields[gguf.Keys.Tokenizer.LIST].contents()


@pytest.mark.parametrize("qtype", [gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.Q8_0])
def test_other_tensor_types_load(model_dir: Path, qtype) -> None:
    path = tm.write_tiny_llama(model_dir / f"tiny-{qtype.name}.gguf", tensor_type=qtype)
    llm = _load(path)
    ids = llm.tokenize(PROMPTS[0].encode())
    assert len(set(greedy(llm, ids, 32))) >= 8


@pytest.mark.slow
def test_draft_alignment_tracks_noise(model_dir: Path, target_path: Path, reference) -> None:
    # Measured (2 prompts x 64 tokens, several model/noise seeds): noise 0.01 ~0.95,
    # 0.02 ~0.9, 0.1 ~0.6, unrelated ~0.0. Thresholds leave a wide margin.
    exact = tm.write_noisy_copy(target_path, model_dir / "exact.gguf", noise=0.0, seed=0)
    assert teacher_forced_agreement(exact, reference) == 1.0
    close = teacher_forced_agreement(
        tm.write_noisy_copy(target_path, model_dir / "close.gguf", noise=0.02, seed=1), reference)
    far = teacher_forced_agreement(
        tm.write_noisy_copy(target_path, model_dir / "far.gguf", noise=0.2, seed=1), reference)
    unrelated = teacher_forced_agreement(tm.write_unrelated(model_dir / "u.gguf", seed=0), reference)
    assert close >= 0.75, close
    assert unrelated <= 0.15, unrelated
    assert close > far + 0.2 > unrelated, (close, far, unrelated)
    # With no noise the draft's own free-running greedy continuation is identical too.
    exact_llm = _load(exact)
    for ids, gen in reference:
        assert greedy(exact_llm, ids, N_GEN) == gen
