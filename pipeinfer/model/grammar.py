"""Constrained decoding with llama.cpp's own grammar sampler (GBNF), on the head: a Grammar
masks a row of logits to the tokens the grammar allows next (the others -inf) and advances
with each token chosen. JSON and JSON schemas become GBNF with llama-cpp-python's port of
llama.cpp's converter (json-schema-to-grammar).

Under speculation the sampler is asked once per accepted position, in order, so the target's
token at every verified position comes from the constrained distribution and the answer is
exactly what non-speculative constrained decoding gives (drafts that break the grammar are
simply not accepted; cutting them before they are sent, and using forced tokens as free
drafts, is not done yet).
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


class Grammar:
    """One generation's grammar state over a vocabulary (`vocab`: llama.cpp's handle)."""

    def __init__(self, vocab, n_vocab: int, eos: int, gbnf: str, root: str = "root"):
        self._smpl = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"),
                                                          root.encode("utf-8"))
        if not self._smpl:
            raise GrammarError("the grammar does not parse (GBNF; llama.cpp's log says where)")
        self.eos = eos
        self._data = np.zeros(n_vocab, TOKEN_DATA)
        self._data["id"] = np.arange(n_vocab, dtype=np.int32)
        self.dead_end = False   # the grammar allowed nothing: the generation was ended

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A float32 copy of `logits`, -inf where the grammar forbids the token. If it
        forbids every token, only the end-of-generation token is left (and `dead_end`)."""
        data = self._data
        data["logit"], data["p"] = logits, 0.0
        array = llama_cpp.llama_token_data_array(
            data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), len(data), -1,
            False)
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(array))
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
