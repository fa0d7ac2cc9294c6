"""Single-node llama.cpp (llama-cpp-python) as the oracle of what pipeinfer computes: greedy
decoding (`llama_greedy`), a chat's prompt as llama-cpp-python renders the GGUF's template
(`llama_chat_tokens`), and beyond plain greedy decoding, tokens chosen through llama.cpp's
own sampler chain (logit bias, then the penalties sampler fed the prompt first, as
llama-server feeds it, then greedy), one token per decode as `llama_greedy` does, and each
position's logprobs from the raw logits (llama-cpp-python's Llama.logits_to_logprobs).

The oracles evaluate a prompt in the batches pipeinfer's stages evaluate it in by default
(`eval_prompt`: chunks of PREFILL_CHUNK tokens, the rest in runs of PREFILL_TAIL): with
repacked weights a row's bits depend on the batch it is in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeinfer.config.job import PREFILL_CHUNK, PREFILL_TAIL
from pipeinfer.schedule.speculation import prompt_runs

_REFERENCE: dict[tuple, list[int]] = {}   # answers computed already: tests ask again


def eval_prompt(llm, tokens: list[int], start: int = 0, tail: int = PREFILL_TAIL) -> None:
    """Evaluate `tokens[start:]` after the `start` cells `llm` keeps, one decode per batch of
    pipeinfer's (schedule/speculation.prompt_runs with the default chunk and `tail`)."""
    llm.n_tokens = start   # (eval drops the cells beyond)
    for run in prompt_runs(range(start, len(tokens)), PREFILL_CHUNK, tail):
        llm.eval(tokens[run.start:run.stop])


def llama_greedy(model: Path, prompt_tokens: list[int], n: int, n_ctx: int = 2048,
                 repack: bool = True) -> list[int]:
    """n greedy tokens from llama-cpp-python's Llama (1 thread), not stopping at EOS
    (`chain_greedy` with llama.cpp's greedy sampler alone).

    flash_attn=True: llama.cpp's own default is flash attention "auto" (on, for CPU), which is
    what pipeinfer's stages get; llama-cpp-python alone turns it off by default, and the other
    attention kernel rounds differently (SmolLM2 then departs at the 23rd token of
    test_pipeline_mpi's SMOL_PROMPT)."""
    key = (str(model), tuple(prompt_tokens), n, n_ctx, repack)
    if key not in _REFERENCE:
        _REFERENCE[key] = chain_greedy(model, prompt_tokens, n, n_ctx=n_ctx, repack=repack)[0]
    return _REFERENCE[key]


_ORACLES: dict[str, tuple] = {}   # per model: its vocabulary and its template's formatter


def llama_chat_tokens(model: Path, messages: list[dict], tools: list | None = None) -> list[int]:
    """llama-cpp-python's prompt for `messages` with the GGUF's template: its
    Jinja2ChatFormatter with the BOS / EOS texts it reads from the vocabulary, tokenized as
    its chat handler does (no BOS added: the template's own special tokens are parsed)."""
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    if str(model) not in _ORACLES:
        llm = Llama(model_path=str(model), vocab_only=True, verbose=False)
        bos, eos = llm.token_bos(), llm.token_eos()
        formatter = Jinja2ChatFormatter(
            template=llm.metadata["tokenizer.chat_template"],
            eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
            bos_token=llm._model.token_get_text(bos) if bos != -1 else "")
        _ORACLES[str(model)] = (llm, formatter)
    llm, formatter = _ORACLES[str(model)]
    result = formatter(messages=messages, tools=tools)
    return llm.tokenize(result.prompt.encode("utf-8"), add_bos=not result.added_special,
                        special=True)


@dataclass(frozen=True)
class Chain:
    logit_bias: tuple[tuple[int, float], ...] = ()
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64
    grammar: str | None = None      # GBNF: llama.cpp's grammar sampler before the chain
    triggers: tuple[int, ...] = ()  # the grammar lazy, waiting for one of these tokens


def _sampler(chain: Chain, n_vocab: int, n_ctx: int):
    import llama_cpp

    smpl = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if chain.logit_bias:
        biases = (llama_cpp.llama_logit_bias * len(chain.logit_bias))(
            *(llama_cpp.llama_logit_bias(t, b) for t, b in chain.logit_bias))
        llama_cpp.llama_sampler_chain_add(smpl, llama_cpp.llama_sampler_init_logit_bias(
            n_vocab, len(chain.logit_bias), biases))
    last_n = n_ctx if chain.repeat_last_n == -1 else chain.repeat_last_n
    llama_cpp.llama_sampler_chain_add(smpl, llama_cpp.llama_sampler_init_penalties(
        n_vocab, last_n, chain.repeat_penalty, chain.frequency_penalty,
        chain.presence_penalty))
    llama_cpp.llama_sampler_chain_add(smpl, llama_cpp.llama_sampler_init_greedy())
    return smpl


def chain_greedy(model: Path, prompt: list[int], n: int, chain: Chain = Chain(),
                 n_ctx: int = 512, repack: bool = True, n_top: int = 0,
                 kept: list[int] | None = None, tail: int = PREFILL_TAIL):
    """(tokens, logprobs): n tokens (not stopping at EOS) chosen by llama.cpp's sampler
    chain, and per position (the chosen token's logprob, {token id: logprob} of the n_top
    most likely). `kept`: a prompt evaluated first, whose common prefix with `prompt` (all
    but prompt's last token at most) stays in the KV cache while the rest of `prompt` is
    evaluated after it in pipeinfer's batches (a server's prompt cache). `tail`: the runs of
    the prompt's last partial chunk (--prefill-tail)."""
    import llama_cpp
    from llama_cpp import Llama

    from pipeinfer.model.llama_lib import llama_repacking

    with llama_repacking(repack):
        llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=PREFILL_CHUNK, n_threads=1,
                    flash_attn=True, verbose=False)
    smpl = _sampler(chain, llm.n_vocab(), n_ctx)
    grammar = None if chain.grammar is None else _grammar(
        llama_cpp.llama_model_get_vocab(llm.model), chain)
    try:
        for token in prompt:
            llama_cpp.llama_sampler_accept(smpl, token)
        if kept:
            eval_prompt(llm, kept, tail=tail)
            shared = next((i for i, (a, b) in enumerate(zip(kept, prompt)) if a != b),
                          min(len(kept), len(prompt)))
            eval_prompt(llm, prompt, min(shared, len(prompt) - 1), tail)
        else:
            eval_prompt(llm, prompt, tail=tail)
        tokens, logprobs = [], []
        for _ in range(n):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1),
                                        shape=(llm.n_vocab(),)).copy()
            if grammar is None:
                token = int(llama_cpp.llama_sampler_sample(smpl, llm._ctx.ctx, -1))
            else:   # the grammar first, then the chain (llama.cpp's grammar-first path)
                token = _constrained(grammar, smpl, row)
            lp = Llama.logits_to_logprobs(row)
            best = np.argsort(-lp, kind="stable")[:n_top] if n_top else ()
            logprobs.append((float(lp[token]), {int(t): float(lp[t]) for t in best}))
            tokens.append(token)
            llm.eval([token])
    finally:
        llama_cpp.llama_sampler_free(smpl)
        if grammar is not None:
            llama_cpp.llama_sampler_free(grammar)
        llm.close()
    return tokens, logprobs


def _grammar(vocab, chain: Chain):
    """llama.cpp's grammar sampler of `chain` (lazy if it has triggers)."""
    import llama_cpp

    if not chain.triggers:
        return llama_cpp.llama_sampler_init_grammar(vocab, chain.grammar.encode(), b"root")
    tokens = (llama_cpp.llama_token * len(chain.triggers))(*chain.triggers)
    return llama_cpp.llama_sampler_init_grammar_lazy_patterns(
        vocab, chain.grammar.encode(), b"root", None, 0, tokens, len(chain.triggers))


def _constrained(grammar, smpl, row: np.ndarray) -> int:
    """The chain's token from `row` after the grammar sampler; both advance past it."""
    import ctypes

    import llama_cpp

    data = (llama_cpp.llama_token_data * len(row))()
    view = np.ctypeslib.as_array(data).view(
        np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)]))
    view["id"], view["logit"], view["p"] = np.arange(len(row)), row, 0.0
    array = llama_cpp.llama_token_data_array(data, len(row), -1, False)
    llama_cpp.llama_sampler_apply(grammar, ctypes.byref(array))
    llama_cpp.llama_sampler_apply(smpl, ctypes.byref(array))
    token = int(array.data[array.selected].id)
    llama_cpp.llama_sampler_accept(smpl, token)
    llama_cpp.llama_sampler_accept(grammar, token)
    return token


def completion_logprobs(model: Path, prompt: list[int], n: int, n_top: int,
                        n_ctx: int = 512, repack: bool = True) -> dict:
    """llama-cpp-python's own greedy completion with `logprobs` (a Llama with logits_all,
    as it requires): its choices[0]["logprobs"] and text. It evaluates the prompt as one
    batch: pipeinfer's batches for prompts of at most PREFILL_TAIL tokens."""
    assert len(prompt) <= PREFILL_TAIL, "a longer prompt would go in other batches"
    from llama_cpp import Llama

    from pipeinfer.model.llama_lib import llama_repacking

    with llama_repacking(repack):
        llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=PREFILL_CHUNK, n_threads=1,
                    flash_attn=True, verbose=False, logits_all=True)
    try:
        out = llm.create_completion(prompt, max_tokens=n, temperature=0, logprobs=n_top,
                                    repeat_penalty=1.0)
    finally:
        llm.close()
    return out["choices"][0]



class KeptConversation:
    """llama.cpp answering the turns of a conversation the way a server slot with a prompt
    cache does: between requests it keeps what it evaluated (the prompt and the answer but
    its last token, which was never fed back), keeps the common prefix with the next prompt
    (all but that prompt's last token at most), evaluates the rest in pipeinfer's batches, then
    decodes greedily one token at a time up to an end-of-generation token or `n`."""

    def __init__(self, model: Path, n_ctx: int = 512, repack: bool = True):
        from llama_cpp import Llama

        from pipeinfer.model.llama_lib import llama_repacking

        with llama_repacking(repack):
            self.llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=PREFILL_CHUNK,
                             n_threads=1, flash_attn=True, verbose=False)
        self.n_ctx = n_ctx

    def answer(self, prompt: list[int], n: int, is_eog) -> tuple[list[int], int]:
        """(tokens, cached): the greedy answer, and how many prompt tokens were kept."""
        import llama_cpp

        llm = self.llm
        held = list(llm._input_ids[:llm.n_tokens])
        shared = next((i for i, (a, b) in enumerate(zip(held, prompt)) if a != b),
                      min(len(held), len(prompt)))
        cached = min(shared, len(prompt) - 1)
        eval_prompt(llm, prompt, cached)
        smpl = _sampler(Chain(), llm.n_vocab(), self.n_ctx)
        tokens: list[int] = []
        try:
            while True:
                token = int(llama_cpp.llama_sampler_sample(smpl, llm._ctx.ctx, -1))
                tokens.append(token)
                if is_eog(token) or len(tokens) == n:
                    return tokens, cached
                llm.eval([token])
        finally:
            llama_cpp.llama_sampler_free(smpl)

    def close(self) -> None:
        self.llm.close()


def token_states(model: Path, text: str, pooling: int | None = None, n_ctx: int = 512,
                 repack: bool = True):
    """llama-cpp-python's `Llama(embedding=True).embed(text)`: with the model's pooling (none
    for SmolLM2) each token's final hidden state [n_tokens, n_embd], not normalized; with
    `pooling` (llama_cpp.LLAMA_POOLING_TYPE_*) llama.cpp's own pooled vector, normalized.
    Also the tokens it evaluated."""
    from llama_cpp import Llama

    from pipeinfer.model.llama_lib import llama_repacking

    extra = {} if pooling is None else {"pooling_type": pooling}
    with llama_repacking(repack):
        llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_ctx, n_threads=1,
                    flash_attn=True, verbose=False, embedding=True, **extra)
    try:
        tokens = llm.tokenize(text.encode("utf-8"))
        return np.array(llm.embed(text, normalize=pooling is not None),
                        dtype=np.float32), tokens
    finally:
        llm.close()


def chunked_states(model: Path, tokens: list[int], chunk: int, n_ctx: int = 512,
                   repack: bool = True) -> np.ndarray:
    """Each token's final hidden state [n_tokens, n_embd] from llama.cpp in embedding mode
    (pooling none) with the tokens evaluated in decodes of `chunk` tokens, the earlier ones
    kept in the KV cache (a server's runs)."""
    import ctypes

    import llama_cpp
    from llama_cpp import Llama

    from pipeinfer.model.llama_lib import llama_repacking

    with llama_repacking(repack):
        llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_ctx, n_threads=1,
                    flash_attn=True, verbose=False, embedding=True)
    batch = llama_cpp.llama_batch_init(chunk, 0, 1)
    rows = []
    try:
        for first in range(0, len(tokens), chunk):
            part = tokens[first:first + chunk]
            batch.n_tokens = len(part)
            for i, token in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, first + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, True
            assert llama_cpp.llama_decode(llm._ctx.ctx, batch) == 0
            ptr = llama_cpp.llama_get_embeddings(llm._ctx.ctx)
            rows.append(np.ctypeslib.as_array(
                ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                shape=(len(part) * llm.n_embd(),)).reshape(len(part), -1).copy())
    finally:
        llama_cpp.llama_batch_free(batch)
        llm.close()
    return np.concatenate(rows)
