"""Log-probabilities of the emitted tokens, from the target's logits at each generated
position (before logit bias and penalties, as llama-server and llama-cpp-python report them),
and their JSON: chat's `logprobs.content` entries and the legacy completions object
(`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).

The values are llama-cpp-python's `Llama.logits_to_logprobs` of the same row (float32: the
row less its maximum, less the log of its summed exponentials), so they equal its logprobs
bit for bit when the logits do (stage outputs are bit-identical to the whole model's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

MAX_TOP = 20   # top_logprobs beyond this is a 400, as OpenAI's API has it


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token: its bytes, its logprob and the `n` most likely tokens there."""
    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """llama-cpp-python's logits_to_logprobs for one row, in float32."""
    top = np.amax(logits)
    if not np.isfinite(top):
        top = 0
    shifted = np.subtract(logits, top, dtype=np.single)
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted)))


def measure(logits: np.ndarray, token: int, n_top: int,
            piece: Callable[[int], bytes]) -> TokenLogprob:
    """The logprob of `token` at a position with these logits, and the n_top best there
    (most likely first; ties: the lower token id first)."""
    logprobs = log_softmax(np.asarray(logits))
    top: tuple = ()
    if n_top > 0:
        best = np.argpartition(-logprobs, n_top - 1)[:n_top]
        best = best[np.lexsort((best, -logprobs[best]))]
        top = tuple((int(t), piece(int(t)), float(logprobs[t])) for t in best)
    return TokenLogprob(token, piece(token), float(logprobs[token]), top)


def _text(piece: bytes) -> str:
    """A token's text: its bytes as UTF-8, an incomplete character left out (llama-server's
    validate_utf8); `bytes` carries them all."""
    return piece.decode("utf-8", "ignore")


def chat_content(entries: Sequence[TokenLogprob]) -> list[dict]:
    """`choices[].logprobs.content` of a chat completion (or of a stream chunk)."""
    return [{"token": _text(e.piece), "logprob": e.logprob, "bytes": list(e.piece),
             "top_logprobs": [{"token": _text(p), "logprob": lp, "bytes": list(p)}
                              for _, p, lp in e.top]}
            for e in entries]


class CompletionLogprobs:
    """The legacy completions `logprobs` object, built as tokens arrive: `text_offset` is
    each token's start in the completion's text (characters, as llama-cpp-python counts)."""

    def __init__(self):
        self._bytes = b""

    def add(self, entries: Sequence[TokenLogprob]) -> dict:
        """The object for `entries` (the next tokens of the completion)."""
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e in entries:
            out["text_offset"].append(len(self._bytes.decode("utf-8", "ignore")))
            self._bytes += e.piece
            out["tokens"].append(_text(e.piece))
            out["token_logprobs"].append(e.logprob)
            top = {_text(p): lp for _, p, lp in e.top}
            top.setdefault(_text(e.piece), e.logprob)
            out["top_logprobs"].append(top)
        return out
