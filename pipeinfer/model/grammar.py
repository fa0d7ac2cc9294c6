"""Constrained decoding with llama.cpp's own grammar sampler (GBNF), on the head: a Grammar
masks a row of logits to the tokens the grammar allows next (the others -inf) and advances
with each token chosen. JSON and JSON schemas become GBNF with llama-cpp-python's port of
llama.cpp's converter (json-schema-to-grammar).

Under speculation the sampler is asked once per accepted position, in order, so the target's
token at every verified position comes from the constrained distribution and the answer is
exactly what non-speculative constrained decoding gives, whatever was drafted. The drafts
themselves follow the grammar too (engine/drafting/grammar_drafts.py): a state cloned at their tip
cuts drafts the grammar forbids, and supplies the text it forces as free drafts.

A lazy grammar (llama.cpp's lazy grammar sampler, as llama-server uses for tool calls with
tool_choice "auto") allows everything until one of its trigger tokens is accepted; from that
token on the grammar applies, the trigger token being its first text (so the grammar must
begin with the trigger's text). While it waits, every token is allowed (the end of the
generation too), so no text is forced and drafts are not cut.
"""

from __future__ import annotations

import ctypes
import json

import numpy as np
import llama_cpp
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class GrammarError(ValueError):
    """A grammar that does not parse, or a schema the converter cannot turn into one."""


def json_grammar(schema: dict | None = None) -> str:
    """GBNF for any JSON object (`schema` None) or for values of a JSON schema."""
    if schema is None:
        return JSON_GBNF
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as err:  # noqa: BLE001 (the converter raises whatever it meets)
        raise GrammarError(f"the JSON schema cannot be turned into a grammar: "
                           f"{type(err).__name__}: {err}") from None


def _sampler(vocab, gbnf: str, root: str, triggers: tuple[int, ...]):
    """llama.cpp's grammar sampler; lazy (waiting for one of the `triggers` tokens) if
    there are any."""
    if not triggers:
        return llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"),
                                                    root.encode("utf-8"))
    tokens = (llama_cpp.llama_token * len(triggers))(*triggers)
    return llama_cpp.llama_sampler_init_grammar_lazy_patterns(
        vocab, gbnf.encode("utf-8"), root.encode("utf-8"), None, 0, tokens, len(triggers))


class Grammar:
    """One generation's grammar state over a vocabulary (`vocab`: llama.cpp's handle);
    `triggers`: the tokens a lazy grammar waits for (none: it applies from the start)."""

    def __init__(self, vocab, n_vocab: int, eos: int, gbnf: str, root: str = "root",
                 triggers: tuple[int, ...] = (), _smpl=None):
        self._args = (vocab, n_vocab, eos, gbnf, root, tuple(triggers))
        self.triggers = tuple(triggers)
        self._smpl = _smpl or _sampler(vocab, gbnf, root, self.triggers)
        if not self._smpl:
            raise GrammarError("the grammar does not parse (GBNF; llama.cpp's log says where)")
        self.eos, self.n_vocab = eos, n_vocab
        self._data: np.ndarray | None = None   # the whole vocabulary's rows (mask), on demand
        self.dead_end = False   # the grammar allowed nothing: the generation was ended

    def fresh(self) -> "Grammar":
        """A new state of the same grammar, at its start (for another thread: a state is
        not to be shared)."""
        return Grammar(*self._args)

    def clone(self) -> "Grammar":
        """A copy of this state, to advance apart from it (llama.cpp's sampler clone)."""
        return Grammar(*self._args, _smpl=llama_cpp.llama_sampler_clone(self._smpl))

    def allowed(self, tokens: np.ndarray) -> np.ndarray:
        """Which of `tokens` (int32 ids) the grammar allows next: llama.cpp's grammar applied
        to those candidates only, so a few cost little next to the whole vocabulary's mask
        (16 ms for Qwen2.5's 151,936 tokens)."""
        data = np.zeros(len(tokens), TOKEN_DATA)
        data["id"] = tokens
        self._apply(data)
        return np.isfinite(data["logit"])

    def allows(self, token: int) -> bool:
        return bool(self.allowed(np.array([token], dtype=np.int32))[0])

    def _apply(self, data: np.ndarray) -> None:
        array = llama_cpp.llama_token_data_array(
            data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), len(data), -1,
            False)
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(array))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A float32 copy of `logits`, -inf where the grammar forbids the token. If it
        forbids every token, only the end-of-generation token is left (and `dead_end`)."""
        if self._data is None:
            self._data = np.zeros(self.n_vocab, TOKEN_DATA)
            self._data["id"] = np.arange(self.n_vocab, dtype=np.int32)
        data = self._data
        data["logit"], data["p"] = logits, 0.0
        self._apply(data)
        out = data["logit"].copy()
        if not np.isfinite(out).any():
            self.dead_end = True
            out[self.eos] = 0.0
        return out

    def accept(self, token: int) -> None:
        """Advance past `token` (one the mask allowed)."""
        if not self.dead_end:
            llama_cpp.llama_sampler_accept(self._smpl, token)

    def close(self) -> None:
        if self._smpl:
            llama_cpp.llama_sampler_free(self._smpl)
            self._smpl = None

    def __del__(self):
        self.close()
