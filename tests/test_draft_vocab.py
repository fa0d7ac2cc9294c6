"""Reduced-vocabulary drafts (model/draft_vocab.py, --draft-vocab): real llama.cpp, real files.

The kept set (special tokens always, unused never, then by count); the reduced file's logits
equal the full draft's at the kept tokens *bitwise* (the same layers on the same input rows,
and each logit is the same dot product of the same hidden state with the same quantized row:
nothing but the number of rows differs), in a prompt batch, a one-token step and a token tree
over copied sequences; the Drafter's choices map back to the right token ids; and the
target's answer is unchanged under `mpiexec -n 2 pipeinfer run --draft-vocab K`, for the tiny
models and (when cached) Qwen2.5-Coder 1.5B with its 0.5B compact draft. Bad K values and
strategies that cannot take a reduced draft are clear errors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeinfer.engine.drafting.drafter import Drafter, DraftParams
from support import tinymodel
from pipeinfer.model.draft_vocab import (DraftVocabError, choose_kept, read_kept, reduced_draft,
                                         write_reduced)
from pipeinfer.model.draft_vocab_stage import DraftVocab, ReducedStage
from pipeinfer.model.embedding import Embedder
from pipeinfer.model.gguf_header import read_header
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.model.tokenizer import Tokenizer
from support import mpi_util
from support.cached_models import cached_models
from support.reduced_drafts import K_QWEN, K_TINY, QWEN_PROMPT, run_json
from support.tiny_set import PROMPT, greedy_reference

CONFIG = StageConfig(n_ctx=256, n_batch=64, n_seq_max=4, n_threads=1)


# --- the kept set ------------------------------------------------------------------------------

def test_choose_kept_orders_by_count_keeps_specials_drops_unused() -> None:
    counts = np.array([0, 5, 9, 5, 0, 7, 100, 0])
    types = np.array([1, 1, 1, 1, 3, 1, 5, 4])   # 4: control, 6: unused, 7: user-defined
    assert choose_kept(counts, types, 4).tolist() == [2, 4, 5, 7]
    assert choose_kept(counts, types, 5).tolist() == [1, 2, 4, 5, 7]       # tie 1/3: lower id
    assert choose_kept(counts, types, 7).tolist() == [0, 1, 2, 3, 4, 5, 7]  # unseen: by id
    assert choose_kept(counts, None, 2).tolist() == [2, 6]
    with pytest.raises(DraftVocabError, match="cannot hold the draft's 2 special tokens"):
        choose_kept(counts, types, 1)
    with pytest.raises(DraftVocabError, match="more than the draft's 7 usable tokens"):
        choose_kept(counts, types, 8)


def test_draft_vocab_maps_columns_to_ids() -> None:
    vocab = DraftVocab(np.array([3, 10, 42], dtype=np.int32), 50)
    assert [vocab.token(i) for i in range(3)] == [3, 10, 42] and vocab.size == 3
    full = vocab.full_row(np.array([1.0, 2.0, 3.0], dtype=np.float32))
    assert full.shape == (50,) and full[42] == 3.0 and full[10] == 2.0
    assert np.isneginf(np.delete(full, [3, 10, 42])).all()


# --- the reduced file against the full draft (tiny Q8_0 model) ---------------------------------

@pytest.fixture(scope="module")
def tiny_reduced(tiny_model: Path) -> tuple[Path, DraftVocab]:
    reduced = reduced_draft(tiny_model, K_TINY)
    header = read_header(tiny_model)
    return reduced, DraftVocab.of(reduced, header.tensors["token_embd.weight"].shape[1])


def test_tiny_kept_set_and_file(tiny_model: Path, tiny_reduced) -> None:
    """K rows, every special token among them (EOS maps back to its id), no tokenizer, the
    same layers byte for byte, made once (the second call is the cached file)."""
    reduced, vocab = tiny_reduced
    assert vocab.size == K_TINY and np.all(np.diff(vocab.kept) > 0)
    tok = Tokenizer(tiny_model)
    ids = [tok.tokenize(s, add_special=False)[0] for s in tinymodel.SPECIAL_TOKENS]
    eos = tok.tokenize(tinymodel.EOS, add_special=False)[0]
    tok.close()
    assert len(ids) == len(tinymodel.SPECIAL_TOKENS) and set(ids) <= set(vocab.kept.tolist())
    assert vocab.token(int(np.searchsorted(vocab.kept, eos))) == eos
    src, dst = read_header(tiny_model), read_header(reduced)
    assert dst.fields["tokenizer.ggml.model"] == "none"
    assert dst.tensors["output.weight"].shape == (src.tensors["output.weight"].shape[0], K_TINY)
    assert dst.tensors["token_embd.weight"].shape[1] == K_TINY
    assert {n for n in dst.tensors if n.startswith("blk.")} == \
        {n for n in src.tensors if n.startswith("blk.")}
    mtime = reduced.stat().st_mtime_ns
    assert reduced_draft(tiny_model, K_TINY) == reduced and reduced.stat().st_mtime_ns == mtime


def _both(model: Path, reduced: Path, vocab: DraftVocab):
    return (Stage(model, CONFIG, final=True, label="full draft"),
            ReducedStage(Stage(reduced, CONFIG, final=True, label="reduced draft"),
                         Embedder(model), vocab))


def _same_at_kept(full: np.ndarray, reduced: np.ndarray, vocab: DraftVocab) -> None:
    assert reduced.shape == (full.shape[0], vocab.size)
    assert np.array_equal(full[:, vocab.kept], reduced), \
        f"max abs diff {np.abs(full[:, vocab.kept] - reduced).max()}"


def _compare_logits(model: Path, reduced: Path, vocab: DraftVocab, prompt: list[int]) -> None:
    """Prompt batch, one-token step, token tree over copied sequences: bitwise equal."""
    full, red = _both(model, reduced, vocab)
    with full, red._stage:
        n = len(prompt)
        _same_at_kept(*(s.decode(list(range(n)), [(0,)] * n, tokens=prompt) for s in (full, red)),
                      vocab)
        nxt = vocab.token(0)
        _same_at_kept(*(s.decode([n], [(0,)], tokens=[nxt]) for s in (full, red)), vocab)
        outs = []
        for stage in (full, red):
            stage.seq_cp(0, 1)
            outs.append(stage.decode([n + 1, n + 1], [(0,), (1,)],
                                     tokens=[vocab.token(1), vocab.token(2)]))
        _same_at_kept(*outs, vocab)


def test_tiny_reduced_logits_are_the_full_drafts(tiny_model: Path, tiny_reduced) -> None:
    tok = Tokenizer(tiny_model)
    prompt = tok.tokenize(PROMPT)
    tok.close()
    _compare_logits(tiny_model, *tiny_reduced, prompt)


def test_reduced_drafter_picks_the_best_kept_token(tiny_model: Path, tiny_reduced) -> None:
    """The Drafter over the reduced draft drafts, at every step, the token id of the full
    draft's argmax over the kept tokens; side branches are token ids too."""
    reduced, vocab = tiny_reduced
    tok = Tokenizer(tiny_model)
    prompt = tok.tokenize(PROMPT)
    tok.close()
    full, red = _both(tiny_model, reduced, vocab)
    with full, red._stage:
        drafter = Drafter(red, 64, vocab)
        branches, probs = drafter.draft(prompt, DraftParams(max_tokens=6, p_split=0.0,
                                                            n_parallel=2), cutoff=0.0)
        assert len(branches[0]) == 6 and len(probs) == 6 and len(branches) == 2
        kept = set(vocab.kept.tolist())
        assert all(t in kept for b in branches for t in b)
        context = list(prompt)
        logits = full.decode(list(range(len(context))), [(0,)] * len(context), tokens=context)
        for token in branches[0]:
            best = int(vocab.kept[np.argmax(logits[-1][vocab.kept])])
            assert token == best
            logits = full.decode([len(context)], [(0,)], tokens=[token])
            context.append(token)


def test_bad_k_is_a_clear_error(tiny_model: Path, tmp_path: Path) -> None:
    n_vocab = read_header(tiny_model).tensors["token_embd.weight"].shape[1]
    with pytest.raises(DraftVocabError, match=f"vocabulary has {n_vocab} tokens"):
        reduced_draft(tiny_model, n_vocab + 1)
    with pytest.raises(DraftVocabError, match="special tokens"):
        reduced_draft(tiny_model, 2)
    stage_file = tmp_path / "stage.gguf"
    write_reduced(tiny_model, stage_file, np.arange(8))   # (tokenizer-less, like a stage file)
    assert read_kept(stage_file).tolist() == list(range(8))
    with pytest.raises(DraftVocabError, match="not a reduced-vocabulary draft"):
        read_kept(tiny_model)
    with pytest.raises(DraftVocabError, match="has no tokenizer"):
        reduced_draft(stage_file, 8)


# --- the target's answer is unchanged (real mpiexec) ------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("strategy, extra", [("pipeinfer", ["-pa", "0", "-pr", "0"]),
                                             ("speculative", ["-np", "2", "-ps", "0.1"]),
                                             ("specpipe", [])])
def test_tiny_answer_unchanged(tiny, strategy: str, extra: list[str]) -> None:
    """The tiny target with its aligned draft reduced to K_TINY tokens, 2 ranks: exactly the
    single-node greedy tokens, and the draft did speculate (pipeinfer with -pa 0: drafting
    whenever the head waits, so that it drafts whatever the timing)."""
    n = 80
    reference = greedy_reference(tiny.target, tiny.prompt, n)
    result = run_json(2, tiny.target, "--strategy", strategy, "-md", str(tiny.aligned),
                  "--layer-split", "0,1", "--draft-vocab", str(K_TINY), *extra, n_predict=n)
    assert result["prompt_tokens"] == list(tiny.prompt)
    assert result["tokens"] == reference
    assert result["draft_vocab"] == K_TINY
    assert result["n_drafted"] > 0, "nothing was speculated: the test would prove nothing"


@pytest.mark.parametrize("args, message", [
    (["--strategy", "pipeinfer", "--draft-vocab", "100000"], "vocabulary has"),
    (["--strategy", "pipeinfer", "--draft-vocab", "2"], "special tokens"),
    (["--strategy", "pipespec", "--draft-vocab", "64"], "--draft-vocab: strategy pipespec"),
])
def test_cli_refuses_bad_draft_vocab(tiny, args: list[str], message: str) -> None:
    launch = mpi_util.run_pipeinfer(None, tiny.target, PROMPT, "-md", str(tiny.aligned), *args,
                                    n_predict=4, timeout=60)
    assert launch.rc != 0 and not launch.timed_out, launch.describe()
    errors = mpi_util.error_lines(launch.stderr)
    assert errors and message in errors[0], launch.describe()
    assert "Traceback" not in launch.stderr, launch.describe()


# --- the real files (skipped unless cached) ----------------------------------------------------



@pytest.fixture(scope="module")
def qwen():
    """(target, compact draft)."""
    return cached_models("qwen-coder-1.5b", "qwen-coder-0.5b-q4_0")


@pytest.mark.slow
def test_qwen_reduced_logits_and_specials(qwen) -> None:
    """Qwen2.5-Coder 0.5B (compact) with 32,768 tokens kept: every control and user-defined
    token kept (<|endoftext|>, <|im_end|>, <tool_call>...), bitwise the full draft's
    logits at the kept tokens."""
    _, draft = qwen
    reduced = reduced_draft(draft, K_QWEN)
    vocab = DraftVocab.of(reduced, 151936)
    types = np.asarray(read_header(draft).fields["tokenizer.ggml.token_type"])
    kept = set(vocab.kept.tolist())
    assert set(np.flatnonzero((types == 3) | (types == 4)).tolist()) <= kept
    assert not kept & set(np.flatnonzero(types == 5).tolist())
    tok = Tokenizer(draft)
    for text in ("<|endoftext|>", "<|im_end|>", "<tool_call>", "</tool_call>"):
        (token,) = tok.tokenize(text, add_special=False)
        assert vocab.token(int(np.searchsorted(vocab.kept, token))) == token, text
    prompt = tok.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    tok.close()
    _compare_logits(draft, reduced, vocab, prompt)


@pytest.mark.slow
def test_qwen_answer_unchanged(qwen) -> None:
    """pipeinfer with the reduced compact draft emits exactly llama.cpp's greedy tokens."""
    from llama_cpp import Llama

    from support.llama_oracle import llama_greedy

    target, draft = qwen
    n = 48
    llm = Llama(model_path=str(target), n_ctx=256, vocab_only=True, verbose=False)
    prompt = llm.tokenize(QWEN_PROMPT.encode())
    llm.close()
    reference = llama_greedy(target, prompt, n)
    result = run_json(2, target, "--strategy", "pipeinfer", "-md", str(draft), "--layer-split",
                  "0,1", "--draft-vocab", str(K_QWEN), n_predict=n, timeout=400,
                  prompt=QWEN_PROMPT)
    assert result["prompt_tokens"] == prompt
    assert result["n_drafted"] > 0, "nothing was speculated: the test would prove nothing"
    assert result["tokens"] == reference


@pytest.mark.slow
def test_serve_two_requests_at_once_exact(smollm2, tmp_path: Path) -> None:
    """`serve --parallel 2 --draft-vocab` (SmolLM2 drafting for itself over 8,192 of its
    49,152 tokens): each request's draft is a slot of the reduced draft (engine/head/lanes.py),
    and both answers, asked at once, are llama.cpp's."""
    import threading

    import httpx

    from support.serving import Server
    from support.serve_oracle import N_CTX, expected

    srv = Server(tmp_path, 2, "-m", str(smollm2), "-md", str(smollm2), "--strategy",
                 "pipeinfer", "--layer-split", "0,1", "-c", str(N_CTX), "--parallel", "2",
                 "--draft-vocab", "8192", "--no-cache-prompt")
    tokenizer = Tokenizer(smollm2)
    try:
        srv.wait_ready(240)
        prompts = ["def is_prime(n):\n", "The three primary colours are"]
        answers: dict[int, str] = {}

        def ask(i: int) -> None:
            r = httpx.post(srv.url + "/v1/completions", timeout=180,
                           json={"prompt": prompts[i], "max_tokens": 32, "temperature": 0})
            answers[i] = r.json()["choices"][0]["text"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(200)
        for i, prompt in enumerate(prompts):
            text, _, _ = expected(smollm2, tokenizer, tokenizer.tokenize(prompt), 32)
            assert answers.get(i) == text, (prompt, srv.stderr[-3000:])
        assert "choosing its 8192 most frequent tokens" in srv.stderr, srv.stderr
    finally:
        srv.kill()
        tokenizer.close()
