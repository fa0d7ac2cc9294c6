"""The target model's tokenizer on the head, from a vocab-only load of the GGUF file."""

from __future__ import annotations

import codecs
import ctypes
import os
from typing import Sequence

import llama_cpp

from . import llama_lib
from .chat_template import ChatTemplate
from .grammar import Grammar, GrammarError
from .llama_lib import LlamaError


class Tokenizer:
    def __init__(self, path: str | os.PathLike):
        llama_lib.init()
        self.path = str(path)
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise LlamaError(f"could not load the vocabulary of {path}: {llama_lib.recent_log(3)}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        if llama_cpp.llama_vocab_type(self._vocab) == llama_cpp.LLAMA_VOCAB_TYPE_NONE:
            self.close()   # (llama.cpp aborts the process on tokenizing without one)
            raise LlamaError(f"{path} has no tokenizer (a pipeinfer stage file?): give the "
                             "model file itself")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._chat_template: ChatTemplate | None = None

    def close(self) -> None:
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special,
                                     parse_special)
        if n < 0:
            raise LlamaError(f"tokenization needs {-n} tokens, more than expected")
        return list(buf[:n])

    def piece(self, token: int, special: bool = False) -> bytes:
        """The token's bytes (`special`: control tokens' text too, else nothing for them)."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text (None if the file has no such key)."""
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    @property
    def add_bos(self) -> bool:
        """Whether tokenizing with special tokens puts a BOS token first."""
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def chat_template(self) -> ChatTemplate:
        """The GGUF's own Jinja chat template (LlamaError if it has none; ChatTemplateError
        if it does not compile), with the BOS / EOS texts as llama-server gives them."""
        if self._chat_template is None:
            source = llama_cpp.llama_model_chat_template(self._model, None)
            if not source:
                raise LlamaError("the model has no chat template")
            self._chat_template = ChatTemplate(source.decode("utf-8"),
                                               self._special_text(llama_cpp.llama_vocab_bos),
                                               self._special_text(llama_cpp.llama_vocab_eos))
        return self._chat_template

    def _special_text(self, which) -> str:
        token = which(self._vocab)
        return "" if token < 0 else self.piece(token, special=True).decode("utf-8", "replace")

    def grammar(self, gbnf: str, triggers: Sequence[str] = ()) -> Grammar:
        """A fresh state of the GBNF grammar `gbnf` over this vocabulary (GrammarError if it
        does not parse); lazy if `triggers` are given: texts of single tokens it waits for
        (GrammarError if one is not a single token)."""
        eos = llama_cpp.llama_vocab_eos(self._vocab)
        if eos < 0:
            eos = llama_cpp.llama_vocab_eot(self._vocab)
        tokens = [self.single_token(text) for text in triggers]
        if None in tokens:
            raise GrammarError(f"a grammar trigger is not one token: {list(triggers)}")
        return Grammar(self._vocab, self.n_vocab, eos, gbnf, triggers=tuple(tokens))

    def single_token(self, text: str) -> int | None:
        """The token whose text `text` is (special tokens included), None if it takes
        several tokens."""
        tokens = self.tokenize(text, add_special=False)
        return tokens[0] if len(tokens) == 1 else None

    def chat_tokens(self, messages: "Sequence[dict]", **context) -> list[int]:
        """The prompt of a conversation (dicts with role and content), as llama-server
        builds it with --jinja: the template's text (`context`: more template variables,
        llama-server's chat_template_kwargs; system messages folded into user messages
        if the template has no system role), less a leading BOS text when the tokenizer
        adds the BOS token itself, tokenized with special tokens parsed."""
        template = self.chat_template()
        text = template.render(template.with_system_folded(messages), **context)
        if self.add_bos and template.bos_token and text.startswith(template.bos_token):
            text = text[len(template.bos_token):]
        return self.tokenize(text)

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
    """Turns token pieces into text without splitting multi-byte UTF-8 characters; the
    special tokens in `preserve` as their text (control tokens are otherwise left out)."""

    def __init__(self, tokenizer: Tokenizer, preserve: frozenset[int] = frozenset()):
        self._tokenizer, self._preserve = tokenizer, preserve
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token: int) -> str:
        special = token in self._preserve
        return self._decoder.decode(self._tokenizer.piece(token, special=special))

    def finish(self, keep_incomplete: bool = True) -> str:
        """The text still held back: an incomplete character at the end becomes U+FFFD, or
        is left out (`keep_incomplete` False: what llama-server does with an answer cut
        inside a character)."""
        if not keep_incomplete:
            self._decoder.reset()
            return ""
        return self._decoder.decode(b"", final=True)
