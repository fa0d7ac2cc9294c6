"""llama-server's `POST /tokenize` and `/detokenize`, and the check of token ids a request
names (a prompt given as ids, logit_bias keys)."""

from __future__ import annotations

import json
from typing import Iterable

from .errors import ApiError
from .fields import boolean


def check_tokens(tokens: Iterable[int], n_vocab: int, param: str) -> None:
    """400 naming `param` if a token id is outside the vocabulary."""
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ApiError(400, f"'{param}' has token id {bad}, outside the vocabulary "
                            f"(0..{n_vocab - 1})", param=param)


def tokenize(tokenizer, body: dict) -> dict:
    """{"content": text, "add_special": false, "parse_special": true, "with_pieces": false}
    -> {"tokens": [id, ...]}, or with pieces [{"id", "piece"}]: the piece a string, or its
    bytes when they are not whole UTF-8 (as llama-server answers)."""
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, "'content' is required and must be a string", param="content")
    tokens = tokenizer.tokenize(content, add_special=boolean(body, "add_special", False),
                                parse_special=boolean(body, "parse_special", True))
    if not boolean(body, "with_pieces", False):
        return {"tokens": tokens}
    return {"tokens": [{"id": t, "piece": _piece(tokenizer.piece(t, special=True))}
                       for t in tokens]}


def _piece(data: bytes) -> str | list[int]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def detokenize(tokenizer, body: dict) -> dict:
    """{"tokens": [id, ...]} -> {"content": text} (special tokens as their text)."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise ApiError(400, f"'tokens' must be a list of token ids, not "
                            f"{json.dumps(tokens)[:80]}", param="tokens")
    check_tokens(tokens, tokenizer.n_vocab, "tokens")
    data = b"".join(tokenizer.piece(t, special=True) for t in tokens)
    return {"content": data.decode("utf-8", "replace")}
