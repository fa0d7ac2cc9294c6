"""Which batch sizes give a token the same logits as one-token decoding, with and without
llama.cpp's weight repacking (the question behind the default `--repack` setting).

For each batch size n, the model reads the prompt, then n tokens of a greedy continuation in
one batch, and again one token at a time; a batch size is *exact* when every row's logits are
bit-identical. Speculative verification is a batch of this kind, so it reproduces one-token
greedy decoding exactly when all its runs use exact batch sizes.

    .venv/bin/python experiments/batch_exactness.py --model qwen-coder-1.5b --max-batch 12
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np


PROMPT = "def quicksort(items):\n    \"\"\"Sort a list of numbers.\"\"\"\n"


def rows(llm, prompt: list[int], tokens: list[int], batch: int) -> np.ndarray:
    llm.reset()
    llm.eval(prompt)
    for i in range(0, len(tokens), batch):
        llm.eval(tokens[i:i + batch])
    return np.array(llm.scores[len(prompt):len(prompt) + len(tokens)])


def exact_sizes(model: Path, repack: bool, max_batch: int) -> list[tuple[int, bool, float]]:
    from llama_cpp import Llama

    from pipeinfer.model.llama_lib import llama_repacking

    with llama_repacking(repack):
        llm = Llama(model_path=str(model), n_ctx=512, n_batch=64, n_ubatch=64, n_threads=1,
                    flash_attn=True, logits_all=True, verbose=False)
    try:
        prompt = llm.tokenize(PROMPT.encode())
        cont = []
        for t in llm.generate(prompt, temp=0.0, repeat_penalty=1.0):
            cont.append(int(t))
            if len(cont) >= max_batch:
                break
        single = rows(llm, prompt, cont, 1)
        out = []
        for n in range(1, max_batch + 1):
            batched = rows(llm, prompt, cont[:n], n)
            diff = float(np.max(np.abs(batched - single[:n])))
            out.append((n, bool(np.array_equal(batched, single[:n])), diff))
        return out
    finally:
        llm.close()


@click.command()
@click.option("--model", default="qwen-coder-1.5b", show_default=True,
              help="A model name of the cache (pipeinfer models list) or a GGUF path.")
@click.option("--max-batch", default=12, show_default=True, type=click.IntRange(1, 64))
def main(model: str, max_batch: int) -> None:
    """Which batch sizes give every token the logits one-token decoding gives it, with
    llama.cpp's repacked weights and with the plain layout (the run sizes `--exact` keeps)."""
    from pipeinfer.model.models import resolve_model

    path = resolve_model(model, fetch_missing=False)
    print(f"model: {path.name}")
    print("batch  repacked            plain")
    table = {r: exact_sizes(path, r, max_batch) for r in (True, False)}
    for (n, ok_r, d_r), (_, ok_p, d_p) in zip(table[True], table[False]):
        cell = lambda ok, d: ("exact" if ok else f"differs {d:.2e}").ljust(18)  # noqa: E731
        print(f"{n:5d}  {cell(ok_r, d_r)}  {cell(ok_p, d_p)}")


if __name__ == "__main__":
    main()
