"""Issue 34, a cheaper draft of another vocabulary (seventh session): how many of the target's
greedy tokens a 4-step greedy draft gets right, on average over every position of the target's
answer to the bench_peers coding prompt, for the Qwen2.5-Coder 0.5B draft (same vocabulary,
token for token) and for SmolLM2 135M (its own vocabulary: the context given as text, its
drafted text compared with the target tokens' text). No pipeline, no timing.

    flock -s /tmp/cpu.lock .venv/bin/python experiments/reference/hop-2026-11-26h/cross_vocab_sim.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "experiments"), str(ROOT)]

from llama_cpp import Llama  # noqa: E402

from bench_peers import CODE_PROMPT, render_prompt  # noqa: E402
from pipeinfer.model.models import resolve_model  # noqa: E402

N, STEPS = 128, 4
KW = dict(n_ctx=1024, n_threads=2, verbose=False)


def greedy(llm: Llama, tokens: list[int], k: int) -> list[int]:
    out = []
    for t in llm.generate(tokens, temp=0.0, top_k=1):
        out.append(t)
        if len(out) >= k:
            break
    return out


def main() -> None:
    prompt = render_prompt("qwen-coder-1.5b", CODE_PROMPT)
    target = Llama(str(resolve_model("qwen-coder-1.5b")), **KW)
    ptoks = target.tokenize(prompt.encode(), add_bos=False, special=True)
    answer = greedy(target, ptoks, N)
    text = lambda ts: target.detokenize(ts).decode("utf-8", "replace")  # noqa: E731

    same = Llama(str(resolve_model("qwen-coder-0.5b-q4_0")), **KW)
    hits = 0
    for i in range(N - 1):
        drafted = greedy(same, ptoks + answer[:i], STEPS)
        j = 0
        while j < len(drafted) and i + j < N and drafted[j] == answer[i + j]:
            j += 1
        hits += j
    print(f"qwen-coder-0.5b-q4_0: {hits / (N - 1):.3f} target tokens right per {STEPS}-step draft")

    other = Llama(str(resolve_model("smollm2")), **KW)
    hits = 0
    for i in range(N - 1):
        context = other.tokenize((prompt + text(answer[:i])).encode(), add_bos=False,
                                 special=True)
        guess = other.detokenize(greedy(other, context, STEPS)).decode("utf-8", "replace")
        j = 0
        while i + j < N and guess.startswith(text(answer[i:i + j + 1])):
            j += 1
        hits += j
    print(f"smollm2 (text): {hits / (N - 1):.3f} target tokens right per {STEPS}-step draft")


if __name__ == "__main__":
    main()
