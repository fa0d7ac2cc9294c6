"""Issue 34, quarter-core scaling: the ceiling that misses put on pipelined speculation, whatever
the draft costs. After each wrong guess the head learns the right token only when the run that
held the guess has crossed every stage, one token's latency through the whole target, and the
runs behind it are cancelled: so t/s <= tokens / (misses x that latency). On N quarter-core
nodes the latency is at least one token through all layers on a quarter core (splitting the
layers does not shorten it), 1 / (llama-bench tg under one node's quota).

Greedy target text for the bench_peers coding prompt (-n 128, as the scaling runs; EOS not
stopped), the draft's greedy guess at every position given the right text before it (what the
head drafts from after each correction), and its two best (a tree of breadth 2 at every
position, what a free draft could add). Prints the misses and the bound per quarter-core
token rate R and 2-node figure S2 given on the command line: `python miss_bound.py R S2`."""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "experiments"), str(ROOT)]
from bench_peers import CODE_PROMPT, render_prompt  # noqa: E402
from pipeinfer.engine.files.draft_files import draft_file  # noqa: E402
from pipeinfer.model.models import resolve_model  # noqa: E402
from pipeinfer.model.stage import Stage, StageConfig  # noqa: E402
from pipeinfer.model.tokenizer import Tokenizer  # noqa: E402

N = 128


def greedy_text(model, prompt: list[int], n: int) -> list[int]:
    """`n` greedy tokens of `model` after `prompt`: the prompt in one batch, then one token a
    decode (also lookahead-2026-11-27/estimate.py's)."""
    config = StageConfig(n_ctx=len(prompt) + n + 8, n_batch=len(prompt) + n, n_seq_max=1)
    with Stage(model, config, final=True, label="greedy") as stage:
        out = stage.decode(range(len(prompt)), [(0,)] * len(prompt), tokens=prompt,
                           logit_rows=[False] * (len(prompt) - 1) + [True])
        text = [int(np.argmax(out[-1]))]
        while len(text) < n:
            out = stage.decode([len(prompt) + len(text) - 1], [(0,)], tokens=[text[-1]])
            text.append(int(np.argmax(out[-1])))
    return text


def main() -> None:
    rate, s2 = float(sys.argv[1]), float(sys.argv[2])
    target = resolve_model("qwen-coder-1.5b")
    draft = draft_file("qwen-coder-0.5b", compact=True).path      # as `run` loads it
    tok = Tokenizer(target)
    prompt = tok.tokenize(render_prompt("qwen-coder-1.5b", CODE_PROMPT))
    tok.close()
    text = greedy_text(target, prompt, N)
    fed = prompt + text[:-1]
    config = StageConfig(n_ctx=len(prompt) + N + 8, n_batch=len(prompt) + N, n_seq_max=1)
    with Stage(draft, config, final=True, label="draft") as stage:
        logits = stage.decode(range(len(fed)), [(0,)] * len(fed), tokens=fed,
                              logit_rows=[i >= len(prompt) - 1 for i in range(len(fed))])
    top2 = np.argsort(-logits, axis=1)[:, :2]
    right = np.array(text)
    misses1 = int(np.sum(top2[:, 0] != right))
    misses2 = int(np.sum((top2[:, 0] != right) & (top2[:, 1] != right)))
    print(f"target {target.name}, draft {draft.name}, {N} tokens")
    print(f"quarter-core rate R = {rate} t/s (latency {1 / rate:.3f} s), 2-node pipeinfer S2 = {s2} t/s")
    for what, m in (("draft's best guess", misses1), ("its two best (breadth-2 tree)", misses2)):
        bound = N / m * rate
        print(f"{what}: {m} misses, {N / m:.2f} tokens a miss, bound {bound:.2f} t/s = "
              f"{bound / s2:.2f}x S2 (goal 3.0x)")


if __name__ == "__main__":
    main()
