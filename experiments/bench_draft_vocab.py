"""Draft tokens per second of the head's Drafter, full vocabulary against --draft-vocab K.

What a draft token costs on the head: one single-token decode of the draft model plus the
Drafter's work on its logits row (engine/drafter.candidates: softmax, the two best). Both
drafts are loaded once (1 thread by default); each repeat syncs the prompt (not timed), then
times Drafter.draft of N tokens with no cutoff, for the full draft then the reduced one.

    flock /tmp/cpu.lock python experiments/bench_draft_vocab.py -md qwen-coder-0.5b -k 32768

Time it alone on the machine (the exclusive lock); the reduced file is made first if absent.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from pipeinfer.engine.drafting.drafter import DraftParams, Drafter
from pipeinfer.model.draft_cache import compact_draft
from pipeinfer.model.draft_vocab import reduced_draft
from pipeinfer.model.draft_vocab_stage import DraftVocab, ReducedStage
from pipeinfer.model.embedding import Embedder
from pipeinfer.model.models import resolve_model
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.model.tokenizer import Tokenizer

PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
          "category) and returns the total amount per category.")


def drafters(draft: Path, k: int, threads: int) -> dict[str, Drafter]:
    config = StageConfig(n_ctx=512, n_batch=64, n_seq_max=1, n_threads=threads)
    full = Drafter(Stage(draft, config, final=True, label="full"), 64)
    reduced_path = reduced_draft(draft, k, print)
    tokenizer = Tokenizer(draft)
    vocab = DraftVocab.of(reduced_path, tokenizer.n_vocab)
    tokenizer.close()
    stage = ReducedStage(Stage(reduced_path, config, final=True, label="reduced"),
                         Embedder(draft), vocab)
    return {"full": full, f"k={k}": Drafter(stage, 64, vocab)}


def draft_rate(drafter: Drafter, prompt: list[int], n: int) -> float:
    drafter.reset()
    drafter.sync(prompt)
    start = time.perf_counter()
    branches, _ = drafter.draft(prompt, DraftParams(max_tokens=n), cutoff=0.0)
    elapsed = time.perf_counter() - start
    assert len(branches[0]) == n
    return n / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-md", "--draft", default="qwen-coder-0.5b")
    ap.add_argument("-k", type=int, default=32768)
    ap.add_argument("-n", type=int, default=64, help="draft tokens per repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args()
    draft = compact_draft(resolve_model(args.draft))
    tokenizer = Tokenizer(draft)
    prompt = tokenizer.tokenize(PROMPT)
    tokenizer.close()
    rates: dict[str, list[float]] = {}
    both = drafters(draft, args.k, args.threads)
    for _ in range(args.repeats):
        for name, drafter in both.items():
            rates.setdefault(name, []).append(draft_rate(drafter, prompt, args.n))
    for name, values in rates.items():
        print(f"{name:>8}: {statistics.median(values):6.2f} draft tokens/s (median; "
              f"{', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
