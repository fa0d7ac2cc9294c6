"""What the serve tests compare a served answer with: the context size their servers launch
with (N_CTX), llama.cpp's greedy answer as the server gives it (`expected`), a chat's prompt
as llama-cpp-python renders it (`chat_tokens`), an answer under a JSON schema
(`assert_schema_answer_exact`); and their tokenizer fixtures' helper."""

from __future__ import annotations

import json

from support.llama_oracle import Chain, chain_greedy, llama_chat_tokens, llama_greedy

N_CTX = 512


def open_tokenizer(model):
    """A module fixture's tokenizer of `model`, closed when the module is done."""
    from pipeinfer.model.tokenizer import Tokenizer

    tok = Tokenizer(model)
    yield tok
    tok.close()


def expected(model, tokenizer, prompt_tokens: list[int], n: int) -> tuple[str, int, str]:
    """llama.cpp's greedy answer as the server gives it: (text, tokens, finish reason)."""
    tokens = llama_greedy(model, prompt_tokens, n, n_ctx=N_CTX, repack=True)
    end = next((i + 1 for i, t in enumerate(tokens) if tokenizer.is_eog(t)), None)
    tokens = tokens[:end] if end else tokens
    return tokenizer.detokenize(tokens), len(tokens), "stop" if end else "length"


def chat_tokens(tokenizer, messages) -> list[int]:
    """The chat's prompt as llama-cpp-python renders the GGUF's Jinja template (as
    llama-server does with --jinja); `tokenizer` is the model's."""
    return llama_chat_tokens(tokenizer.path, messages)


def assert_schema_answer_exact(client, smollm2, tokenizer, ask, schema, n: int,
                               repack: bool = True):
    """The server's greedy answer to `ask` under `schema` is llama.cpp's with its grammar
    sampler, one token per decode (at most `n` tokens; `repack`: the server's weight layout).
    Returns the server's answer."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    got = client.chat.completions.create(
        model="smollm2", messages=ask, max_tokens=n, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "answer", "schema": schema}})
    tokens, _ = chain_greedy(smollm2, chat_tokens(tokenizer, ask), n,
                             Chain(grammar=json_schema_to_gbnf(json.dumps(schema))),
                             n_ctx=N_CTX, repack=repack)
    end = next((i for i, t in enumerate(tokens) if tokenizer.is_eog(t)), len(tokens))
    assert got.choices[0].message.content == tokenizer.detokenize(tokens[:end])
    return got
