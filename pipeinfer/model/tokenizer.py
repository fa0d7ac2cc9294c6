"""The target model's tokenizer on the head, from a vocab-only load of the GGUF file."""

from __future__ import annotations

import codecs
import ctypes
import os
from typing import Sequence

import llama_cpp

from . import llama_lib
from .llama_lib import LlamaError


class Tokenizer:
    def __init__(self, path: str | os.PathLike):
        llama_lib.init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise LlamaError(f"could not load the vocabulary of {path}: {llama_lib.recent_log(3)}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)

    def close(self) -> None:
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, True)
        if n < 0:
            raise LlamaError(f"tokenization needs {-n} tokens, more than expected")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> str:
        return self.piece(token).decode("utf-8", "replace")

    def apply_chat_template(self, messages: "str | Sequence[tuple[str, str]]") -> str:
        """The conversation `messages` ((role, content) pairs in order, or one user message)
        rendered with the model's chat template, ending with the assistant's turn (llama.cpp's
        rendering of the templates it knows, as llama-cpp-python's and llama-server's)."""
        template = llama_cpp.llama_model_chat_template(self._model, None)
        if not template:
            raise LlamaError("the model has no chat template; run without --chat")
        if isinstance(messages, str):
            messages = [("user", messages)]
        encoded = [(role.encode("utf-8"), content.encode("utf-8")) for role, content in messages]
        chat = (llama_cpp.llama_chat_message * len(encoded))(
            *(llama_cpp.llama_chat_message(role, content) for role, content in encoded))
        size = 2 * sum(len(r) + len(c) for r, c in encoded) + 1024
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(template, chat, len(encoded), True, buf, size)
        if n > size:
            buf = ctypes.create_string_buffer(n)
            n = llama_cpp.llama_chat_apply_template(template, chat, len(encoded), True, buf, n)
        if n < 0:
            raise LlamaError("llama.cpp does not recognise this model's chat template")
        return buf.raw[:n].decode("utf-8")


class TextStream:
    """Turns token pieces into text without splitting multi-byte UTF-8 characters."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._tokenizer.piece(token))

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)
