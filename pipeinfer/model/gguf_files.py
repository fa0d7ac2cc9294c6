"""A GGUF file on disk as the model cache and its derived files handle it: the error they
raise, the checks a complete file passes, a lock for making one, and progress messages."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .gguf_header import (GGUF_MAGIC, GGUF_VERSIONS, Header, HeaderError, check_extents,
                          read_header)

Progress = Callable[[str], None] | None

log = logging.getLogger(__name__)


class ModelError(Exception):
    """A model could not be found, fetched or validated (one-line message)."""


def _check_header(path: Path, expected_size: int | None) -> None:
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except FileNotFoundError:
        raise ModelError(f"model file not found: {path}") from None
    except OSError as exc:
        raise ModelError(f"{path} is not readable: {exc.strerror}") from None
    if head[:4] != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF file (magic {head[:4]!r})")
    version = int.from_bytes(head[4:8], "little")
    if version not in GGUF_VERSIONS:
        raise ModelError(f"{path} has unsupported GGUF version {version}")
    actual = path.stat().st_size
    if expected_size is not None and actual != expected_size:
        raise ModelError(f"{path} has {actual} bytes, expected {expected_size}")


def check_gguf(path: str | os.PathLike[str], expected_size: int | None = None) -> None:
    """Raise ModelError unless ``path`` is a complete, readable GGUF file.

    Checks the magic and version, the exact size if ``expected_size`` is
    given, that the whole header parses, and that every tensor's data lies
    within the file.
    """
    checked_header(path, expected_size)


def checked_header(path: str | os.PathLike[str], expected_size: int | None = None) -> Header:
    """`check_gguf`'s checks and the header they parse, for callers that read it too (one
    parse instead of two: ~0.04 s for Qwen2.5's 151,936-token vocabulary)."""
    path = Path(path)
    _check_header(path, expected_size)
    try:
        header = read_header(path)
        check_extents(header)
    except HeaderError as exc:
        raise ModelError(str(exc)) from None
    return header


@contextmanager
def locked(lock_path: Path, progress: Progress = None,
           waiting: str | None = None) -> Iterator[None]:
    """Hold an exclusive flock on ``lock_path`` for the duration; ``waiting``, if given, is
    said (log and ``progress``) when another process holds it first."""
    with open(lock_path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                say(log, progress, waiting)
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def say(logger: logging.Logger, progress: Progress, message: str) -> None:
    """Log ``message`` (INFO, on the logger of the module doing the work) and pass it to
    ``progress``, if any."""
    logger.info("%s", message)
    if progress is not None:
        progress(message)
