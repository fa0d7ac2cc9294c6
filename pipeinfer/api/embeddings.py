"""`POST /v1/embeddings`, OpenAI's shape: `input` a string, a list of strings, an array of
token ids or a list of those; `encoding_format` "float" (the default) or "base64" (little-
endian float32, what the `openai` SDK asks for by default); each input's vector comes from
the last stage's final hidden states, pooled (the model's pooling type, else the mean) and
L2-normalized on the head (engine/head/embedding_job.py). `usage` counts the inputs' tokens.

Parsing and the answer are here (the front's); the ticket needs the tokenizer, so the job
makes it (serve/prepare.py).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np

from .requests import ApiError, texts_or_tokens
from .events import Embedded

MAX_INPUTS = 2048        # inputs of one request, as OpenAI allows
FORMATS = ("float", "base64")


@dataclass(frozen=True)
class EmbedAsk:
    """One checked embedding request (inputs as given: texts or token ids)."""
    inputs: tuple[str | tuple[int, ...], ...]
    model: str | None = None
    encoding_format: str = "float"
    n_choices: int = 1     # (one answer: what the front's request table counts)
    stream: bool = False


def parse(body: dict) -> EmbedAsk:
    """The request's inputs and options (400 naming the field that is wrong)."""
    inputs = texts_or_tokens(body.get("input"), "input")
    if len(inputs) > MAX_INPUTS:
        raise ApiError(400, f"'input' has {len(inputs)} items, at most {MAX_INPUTS} are "
                            "allowed", param="input")
    fmt = body.get("encoding_format") or "float"
    if fmt not in FORMATS:
        raise ApiError(400, f"'encoding_format' must be 'float' or 'base64', not "
                            f"{json.dumps(fmt)}", param="encoding_format")
    if body.get("dimensions") is not None:
        raise ApiError(400, "'dimensions' is not supported by this server (the model's "
                            "vectors have its own size)", param="dimensions")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model")
    return EmbedAsk(tuple(one if isinstance(one, str) else tuple(one) for one in inputs),
                    model, fmt)


def response(ask: EmbedAsk, model: str, answer: Embedded) -> dict:
    """OpenAI's embeddings list."""
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, ask.encoding_format)}
            for i, v in enumerate(answer.vectors)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": answer.prompt_tokens,
                      "total_tokens": answer.prompt_tokens}}


def _encoded(vector, fmt: str):
    vector = np.asarray(vector, dtype="<f4")
    if fmt == "base64":
        return base64.b64encode(vector.tobytes()).decode("ascii")
    return [float(x) for x in vector]
