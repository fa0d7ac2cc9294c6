"""The request fields that shape a completion besides its prompt: sampling (llama.cpp's chain:
logit bias, repetition penalties, top-k, top-p, min-p, temperature, seed), logprobs, and the
fields this server does not support, each refused with a 400 naming it rather than ignored
(a field that would change the answer is never silently dropped).

Types are checked strictly: a boolean is not a number, a number not a string.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from ..model.sampling import SamplingParams
from .errors import ApiError
from .logprobs import MAX_TOP

PENALTY_RANGE = (-2.0, 2.0)    # frequency / presence penalties, as OpenAI documents them
BIAS_RANGE = (-100.0, 100.0)   # logit_bias values: -100 bans a token, +100 forces it

# Fields that change the answer and are not supported (yet), with their harmless values
# (absent or null is harmless too).
REFUSED = {"functions": ([],),
           "suffix": ("",), "mirostat": (0,), "typical_p": (1,), "dry_multiplier": (0,),
           "xtc_probability": (0,), "top_n_sigma": (-1,), "dynatemp_range": (0,),
           "n_probs": (0,)}


def integer(body: dict, name: str, default):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer, not {json.dumps(value)}", param=name)
    return value


def number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a number, not {json.dumps(value)}", param=name)
    if not low <= value <= high:
        raise ApiError(400, f"'{name}' must be between {low:g} and {high:g}, not {value:g}",
                       param=name)
    return float(value)


def boolean(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, not {json.dumps(value)}",
                       param=name)
    return value


def sampling(body: dict, defaults: SamplingParams) -> SamplingParams:
    """The request's sampling settings over the server's defaults."""
    temp = number(body, "temperature", defaults.temp, 0.0, 2.0)
    top_p = number(body, "top_p", defaults.top_p, 0.0, 1.0)
    if top_p == 0.0:
        raise ApiError(400, "'top_p' must be above 0", param="top_p")
    top_k = integer(body, "top_k", defaults.top_k)
    if top_k < 0:
        raise ApiError(400, f"'top_k' must be 0 (off) or more, not {top_k}", param="top_k")
    seed = integer(body, "seed", defaults.seed)
    repeat = number(body, "repeat_penalty", defaults.repeat_penalty, 0.0, math.inf)
    if repeat == 0.0:
        raise ApiError(400, "'repeat_penalty' must be above 0 (1: off)", param="repeat_penalty")
    last_n = integer(body, "repeat_last_n", defaults.repeat_last_n)
    if last_n < -1:
        raise ApiError(400, f"'repeat_last_n' must be -1 (the whole context), 0 (off) or "
                            f"more, not {last_n}", param="repeat_last_n")
    return replace(defaults, temp=temp, top_p=top_p, top_k=top_k, seed=seed % (1 << 64),
                   min_p=number(body, "min_p", defaults.min_p, 0.0, 1.0),
                   repeat_penalty=repeat, repeat_last_n=last_n,
                   frequency_penalty=number(body, "frequency_penalty",
                                            defaults.frequency_penalty, *PENALTY_RANGE),
                   presence_penalty=number(body, "presence_penalty",
                                           defaults.presence_penalty, *PENALTY_RANGE),
                   logit_bias=logit_bias(body))


def logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: {"token id": bias from -100 to 100}; `false` bans the token
    (llama-server's form). Whether the ids are in the vocabulary is checked with it."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ApiError(400, "'logit_bias' must be an object of token ids (as strings) to "
                            "numbers", param="logit_bias")
    out = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.strip().lstrip("-").isdigit()):
            raise ApiError(400, f"'logit_bias' keys must be token ids, not {json.dumps(key)}",
                           param="logit_bias")
        if bias is False:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not BIAS_RANGE[0] <= bias <= BIAS_RANGE[1]:
            raise ApiError(400, f"'logit_bias' of token {key} must be a number from -100 to "
                                f"100 (or false), not {json.dumps(bias)}", param="logit_bias")
        out.append((int(key), float(bias)))
    return tuple(out)


def logprobs(body: dict, chat: bool) -> int | None:
    """How many top tokens to report with each emitted token's logprob (None: no logprobs).
    Chat: `logprobs` true and `top_logprobs` (0 to 20); completions: `logprobs` (0 to 20)."""
    if chat:
        wanted = boolean(body, "logprobs", False)
        top = integer(body, "top_logprobs", None)
        if top is not None and not wanted:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return _top(top or 0, "top_logprobs") if wanted else None
    top = integer(body, "logprobs", None)
    return None if top is None else _top(top, "logprobs")


def _top(n: int, name: str) -> int:
    if not 0 <= n <= MAX_TOP:
        raise ApiError(400, f"'{name}' must be from 0 to {MAX_TOP}, not {n}", param=name)
    return n


def refuse_unsupported(body: dict, chat: bool) -> None:
    """400 naming the first field given that would change the answer but is not supported."""
    for name, harmless in REFUSED.items():
        value = body.get(name)
        if value is None or value in harmless:
            continue
        raise ApiError(400, f"'{name}' is not supported by this server", param=name)
    if body.get("function_call") not in (None, "none", "auto"):
        raise ApiError(400, "'function_call' is not supported by this server (use 'tools')",
                       param="function_call")
    if not chat:
        if body.get("tools"):
            raise ApiError(400, "'tools' needs a chat: use /v1/chat/completions",
                           param="tools")
        if boolean(body, "echo", False):
            raise ApiError(400, "'echo' is not supported by this server", param="echo")
        best_of = integer(body, "best_of", 1)
        if best_of != 1:
            raise ApiError(400, f"'best_of' must be 1 (one choice per prompt), not {best_of}",
                           param="best_of")


@dataclass(frozen=True)
class Constraint:
    """What an answer keeps to, and the field it came from (named in errors): a GBNF grammar
    as given, or JSON: any object (`schema` None) or values of a JSON schema. The job turns
    JSON into GBNF (serve/prepare.py), where llama.cpp's converter is."""
    param: str
    gbnf: str | None = None
    schema: dict | None = None


def constraint(body: dict) -> Constraint | None:
    """What the answer must follow, if anything: `response_format` {"type": "json_object"}
    (any JSON object; llama-server's "schema" in it too) or {"type": "json_schema",
    "json_schema": {"schema": ...}}, llama-server's `json_schema` and `grammar` fields.
    Unknown types and malformed values are a 400 naming the field."""
    fmt, grammar, schema = body.get("response_format"), body.get("grammar"), \
        body.get("json_schema")
    given = [n for n, v in (("response_format", fmt), ("grammar", grammar),
                            ("json_schema", schema)) if v not in (None, "", {})
             and not (n == "response_format" and isinstance(v, dict)
                      and v.get("type") == "text")]
    if len(given) > 1:
        raise ApiError(400, f"give one of {', '.join(given)}, not several", param=given[1])
    if not given:
        return None
    if given[0] == "grammar":
        if not isinstance(grammar, str):
            raise ApiError(400, "'grammar' must be a string (GBNF)", param="grammar")
        return Constraint("grammar", gbnf=grammar)
    if given[0] == "json_schema":
        return _schema(schema, "json_schema")
    return _format(fmt)


def _format(fmt) -> Constraint:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return _schema(fmt.get("schema"), "response_format", optional=True)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not (isinstance(spec, dict) and isinstance(spec.get("schema"), dict)):
            raise ApiError(400, "'response_format.json_schema' must be an object with a "
                                "'schema'", param="response_format")
        return _schema(spec["schema"], "response_format")
    raise ApiError(400, f"'response_format.type' must be 'text', 'json_object' or "
                        f"'json_schema', not {json.dumps(kind)}", param="response_format")


def _schema(schema, param: str, optional: bool = False) -> Constraint:
    if schema is None and optional:
        return Constraint(param)
    if not isinstance(schema, dict):
        raise ApiError(400, f"'{param}': the JSON schema must be an object", param=param)
    return Constraint(param, schema=schema)
