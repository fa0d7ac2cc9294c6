"""Content-keyed cache of stage files, so each rank slices a model once per layer range.

The key is a digest of the model file's bytes (memoised per path, size, mtime and inode, so a
1 GB file is hashed once) plus the layer range. Files are written under an exclusive lock to a
temporary name and renamed, so concurrent runs never read a half-written stage. Slicing is
logged (INFO), the one slow step of a first run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Callable

from .models import ModelError, cache_dir, locked
from .partition import StageRange
from .slicing import model_info, open_model, write_stage

SLICER_VERSION = 4  # bump when the stage file layout changes (3: a final stage's output head
#                    stands in for its unused token embeddings, slicing.TIED_OUTPUT_ARCHS;
#                    4: no stage file carries the tokenizer)

log = logging.getLogger(__name__)


def stages_dir() -> Path:
    return cache_dir() / "stages"


def content_digest(model: str | os.PathLike) -> str:
    """sha256 of the file's bytes, memoised in the cache by (path, size, mtime, inode)."""
    path = Path(model).resolve()
    st = path.stat()
    memo_dir = stages_dir() / "digests"
    try:
        memo_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _unwritable(err) from None
    identity = f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}"
    memo = memo_dir / (hashlib.sha256(identity.encode()).hexdigest()[:24] + ".json")
    try:
        return json.loads(memo.read_text())["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    tmp = memo.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"identity": identity, "sha256": digest.hexdigest()}))
    os.replace(tmp, memo)
    return digest.hexdigest()


def stage_key(model_digest: str, stage: StageRange) -> str:
    """The cache name (without .gguf) of `stage` cut from the model whose sha256 is
    `model_digest`: what every rank looks up, whether it cuts the file or receives it."""
    return f"{model_digest[:32]}-v{SLICER_VERSION}-{stage.first}-{stage.last}" + \
        ("-final" if stage.final else "")


def cached_slices(model_digest: str) -> list[tuple[StageRange, Path]]:
    """Every slice of the model whose sha256 is `model_digest` in the cache, cut by this
    slicer version, as (range, path); the rank is not part of a key: it is 0 here."""
    prefix = f"{model_digest[:32]}-v{SLICER_VERSION}-"
    found = []
    for path in stages_dir().glob(prefix + "*.gguf"):
        m = _RANGE.fullmatch(path.name[len(prefix):])
        if m:
            found.append((StageRange(0, int(m[1]), int(m[2]), bool(m[3])), path))
    return found


_RANGE = re.compile(r"(\d+)-(\d+)(-final)?\.gguf")  # the end of a stage_key, with .gguf


def cached_file(key: str) -> Path | None:
    """The cache's file named `key`, if a complete one is there (files appear only by
    rename, once written and checked)."""
    path = stages_dir() / f"{key}.gguf"
    return path if path.is_file() else None


def stage_file(model: str | os.PathLike, stage: StageRange,
               progress: Callable[[str], None] | None = None) -> Path:
    """Path of the stage file for `stage` of `model`, writing it on first use; `progress`, if
    given, also gets the message logged when it slices (a caller can tell it did)."""
    out = stages_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
        key = stage_key(content_digest(model), stage)
        hit = cached_file(key)
        if hit is not None:
            return hit
        dst = out / f"{key}.gguf"
        with locked(out / f"{key}.lock"):
            if not dst.exists():
                message = f"slicing {Path(model).name}: layers [{stage.first}, {stage.last})"
                log.info("%s", message)
                if progress:
                    progress(message)
                reader = open_model(model)
                write_stage(reader, model_info(reader, model), stage, dst)
        return dst
    except OSError as err:
        raise _unwritable(err) from None


def _unwritable(err: OSError) -> ModelError:
    return ModelError(f"stage cache {stages_dir()} is not writable ({err.strerror or err}); "
                      "set PIPEINFER_CACHE to a writable directory")
