"""Which file to load as a draft model: the compact copy (compact.py) unless nothing converts.

A draft's numbers only decide what is guessed, never the output, so every draft model is
loaded compacted by default (``--no-compact-draft`` turns it off).  The decision reads the
header only (gguf_header: 0.04 s for Qwen2.5's 151k-token vocabulary, where gguf.GGUFReader
takes 7 s), so a draft with nothing to convert costs nothing and is never hashed.  A registry
model with a derived compact entry (``ModelSpec.derived_from``) maps to that entry, made by
``fetch`` under its lock; any other file is copied once to ``<cache>/compact/``, keyed by its
content digest (stage_cache.content_digest, memoised), under an exclusive lock so that ranks
starting together make it once.  A cache that cannot be written (disk full, permissions) only
costs the speed-up: the original file is used, with a warning.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .compact import COMPACT_VERSION, compact_copy, converts
from .gguf_header import Header, HeaderError, read_header
from .models import MODELS, ModelError, ModelSpec, Progress, cache_dir, fetch, locked, say

log = logging.getLogger(__name__)


def compact_dir() -> Path:
    return cache_dir() / "compact"


def compact_draft(path: str | os.PathLike[str], progress: Progress = None, *,
                  header: Header | None = None) -> Path:
    """The file to load for the draft model at ``path``: ``path`` itself when no tensor would
    be requantized, else its compact copy, made on first use (seconds) and cached.  Raises
    ModelError if ``path`` is not a readable GGUF file; falls back to ``path``, with a
    warning, if the copy cannot be written.  ``header``: ``path``'s, if already parsed."""
    path = Path(path)
    tensors = header.tensors.values() if header is not None else _tensors(path)
    if not any(converts(t.name, t.ggml_type, t.shape) for t in tensors):
        return path
    derived = derived_entry(path)
    try:
        if derived is not None:
            return fetch(derived.name, progress)
        return _cached_copy(path, progress)
    except OSError as err:
        log.warning("draft model %s: cannot write its compact copy (%s); using it as it is "
                    "(drafting is slower, the output the same)", path.name, err.strerror or err)
        return path


def derived_entry(path: Path) -> ModelSpec | None:
    """The registry's compact entry derived from the registry model cached at ``path``."""
    where = path.resolve()
    for spec in MODELS.values():
        if spec.derived_from and MODELS[spec.derived_from].path.resolve() == where:
            return spec
    return None


def _tensors(path: Path):
    try:
        return read_header(path).tensors.values()
    except HeaderError as err:
        raise ModelError(str(err)) from None
    except OSError as err:
        raise ModelError(f"{path} is not readable: {err.strerror or err}") from None


def _cached_copy(path: Path, progress: Progress) -> Path:
    """``<cache>/compact/<digest>-v<N>.gguf``, written under ``<same>.lock`` if absent."""
    from .stage_cache import content_digest  # it imports slicing, which only this needs

    out = compact_dir()
    out.mkdir(parents=True, exist_ok=True)
    key = f"{content_digest(path)[:32]}-v{COMPACT_VERSION}"
    dst = out / f"{key}.gguf"
    if dst.exists():  # files only reach their final name complete (compact_copy)
        return dst
    waiting = f"draft model {path.name}: waiting for another process making its compact copy"
    with locked(out / f"{key}.lock", progress, waiting):
        if not dst.exists():
            say(log, progress, f"draft model {path.name}: making its compact copy (once, some "
                           f"seconds) in {out}")
            try:
                compact_copy(path, dst, progress)
            except (ValueError, KeyError, IndexError) as err:  # gguf.GGUFReader's complaints
                raise ModelError(f"{path} cannot be read as a GGUF file: {err}") from None
    return dst
