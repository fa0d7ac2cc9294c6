"""Model files the tests use only if they are in the model cache already: tests do not fill
the cache (a fetch takes minutes and the network), they skip."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeinfer.model.models import ModelError, resolve_model


def cached_models(*names: str) -> tuple[Path, ...]:
    """The cached files of the models `names`, in order; the test is skipped, saying which
    is missing, if one is not cached."""
    try:
        return tuple(resolve_model(name, fetch_missing=False) for name in names)
    except ModelError as err:
        pytest.skip(f"{' and '.join(names)} not cached: {err}")
