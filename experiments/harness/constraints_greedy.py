"""How often pipeinfer's greedy path needs the full grammar mask (`bench_constraints.py
--greedy-path`; the engines themselves are compared by bench_constraints.py's default run).

pipeinfer's greedy sampler (model/sampling.py, Sampler._allowed_best) first asks the grammar
whether the unconstrained argmax is allowed (one candidate) and masks the whole vocabulary
only when it is not. Two counts, with pipeinfer's own Grammar (model/grammar.py, llama.cpp's
sampler) on bench_turns.py's JSON schema:

  replay  bench_constraints.py's fixed answer, token by token: at how many positions the
          grammar allows exactly one token (forced), a few, or many;
  greedy  a real greedy generation of the 1.5B model (llama-cpp-python's Llama, n_threads=1,
          bench_turns.py's JSON question in the model's chat template): at how many
          positions the unconstrained argmax was not allowed (where pipeinfer pays the mask),
          with the time the checks and the masks took.

"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pipeinfer.model.grammar import json_grammar
from pipeinfer.model.tokenizer import Tokenizer

from .json_task import ANSWER, JSON_ASK, SCHEMA

MODEL = Path.home() / ".cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def replay(tok: Tokenizer, gbnf: str) -> None:
    tokens = tok.tokenize(ANSWER, add_special=False, parse_special=False)
    g = tok.grammar(gbnf)
    sizes = []
    for t in tokens + [g.eos]:
        allowed = np.isfinite(g.mask(np.zeros(tok.n_vocab, np.float32)))
        assert allowed[t], f"the grammar forbids the answer's token {t}"
        sizes.append(int(allowed.sum()))
        g.accept(t)
    sizes = np.array(sizes)
    print(f"replay: {len(sizes)} positions ({len(tokens)} answer tokens + the end); allowed "
          f"exactly 1: {int((sizes == 1).sum())}, 2-20: {int(((sizes > 1) & (sizes <= 20)).sum())}, "
          f"21-1000: {int(((sizes > 20) & (sizes <= 1000)).sum())}, "
          f"over 1000: {int((sizes > 1000).sum())}")


def greedy(tok: Tokenizer, gbnf: str, n_max: int, model: Path = MODEL) -> None:
    import llama_cpp
    llm = llama_cpp.Llama(str(model), n_ctx=1024, n_threads=1, n_threads_batch=1,
                          verbose=False)
    prompt = tok.chat_tokens([{"role": "user", "content": JSON_ASK}])
    g = tok.grammar(gbnf)
    eog = {t for t in range(tok.n_vocab) if llama_cpp.llama_vocab_is_eog(tok._vocab, t)}
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - t0
    out, misses, t_check, t_mask, t_model = [], [], 0.0, 0.0, 0.0
    for _ in range(n_max):
        # the last position's row (Llama.scores keeps rows only with logits_all)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                       shape=(llm.n_vocab(),)).astype(np.float32)
        best = int(np.argmax(logits))
        t0 = time.perf_counter()
        ok = g.allows(best)
        t_check += time.perf_counter() - t0
        if not ok:
            t0 = time.perf_counter()
            masked = g.mask(logits)
            t_mask += time.perf_counter() - t0
            misses.append((len(out), best, int(np.argmax(masked))))
            best = int(np.argmax(masked))
        g.accept(best)
        out.append(best)
        if best in eog:
            break
        t0 = time.perf_counter()
        llm.eval([best])
        t_model += time.perf_counter() - t0
    text = llm.detokenize(out[:-1] if out[-1] in eog else out).decode("utf-8", "replace")
    print(f"greedy: prompt {len(prompt)} tokens ({prefill:.1f} s); {len(out)} tokens generated "
          f"({'ended' if out[-1] in eog else 'cut at --n'}), model {t_model:.1f} s "
          f"({(len(out) - 1) / t_model:.2f} t/s)")
    print(f"greedy: the argmax was not allowed at {len(misses)} of {len(out)} positions: "
          f"full masks {t_mask * 1e3:.1f} ms in all, argmax checks {t_check * 1e3:.2f} ms in "
          f"all ({t_check / len(out) * 1e3:.3f} ms each)")
    for pos, was, now in misses:
        print(f"  position {pos}: argmax {tok.piece(was, special=True)!r} -> "
              f"{tok.piece(now, special=True)!r}")
    print("text: " + text)


def run(n: int, model: Path = MODEL) -> None:
    """Both counts: the replay, then a greedy generation of at most `n` tokens."""
    tok = Tokenizer(model)
    gbnf = json_grammar(SCHEMA)
    replay(tok, gbnf)
    greedy(tok, gbnf, n, model)
