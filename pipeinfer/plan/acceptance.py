"""How often the draft model guesses the target's next token: a short greedy probe on one
node (at most PROBE_TOKENS tokens) on a built-in coding chat prompt, cached per model pair.
A reduced-vocabulary draft (model/draft_vocab.py) is probed as the head drafts with it: fed
its full file's embeddings, its choices mapped back to token ids."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from ..model.draft_vocab import KEPT_KEY, read_kept
from ..model.embedding import Embedder
from ..model.gguf_header import read_header
from ..model.llama_lib import LlamaError
from ..model.models import cache_dir
from ..model.stage import Stage, StageConfig
from ..model.stage_cache import content_digest
from ..model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PROBE_TOKENS = 64
PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
          "category) and returns the total amount per category, sorted by amount.")


def accept_rate(target: Path, draft: Path, n: int = PROBE_TOKENS,
                embeddings: Path | None = None) -> float:
    """Share of the target's greedy tokens the draft, fed the same text, predicts greedily.
    `embeddings`: for a reduced draft, the full draft file it was cut from."""
    key = f"accept-{content_digest(target)[:16]}-{content_digest(draft)[:16]}-{n}.json"
    where = cache_dir() / "profiles" / key
    try:
        return float(json.loads(where.read_text())["accept_rate"])
    except (OSError, ValueError, KeyError):
        pass
    log.info("probing the draft's agreement with the target (%d tokens)", n)
    rate = _probe(target, draft, n, embeddings)
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_name(where.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"accept_rate": rate}))
    os.replace(tmp, where)
    return rate


def _probe(target: Path, draft: Path, n: int, embeddings: Path | None) -> float:
    prompt = _prompt(target)
    total = len(prompt) + n
    config = StageConfig(n_ctx=total + 8, n_batch=total, n_seq_max=1)
    with Stage(target, config, final=True, label="probe target") as stage:
        rows = [False] * (len(prompt) - 1) + [True]
        out = stage.decode(range(len(prompt)), [(0,)] * len(prompt), tokens=prompt,
                           logit_rows=rows)
        generated = [int(np.argmax(out[-1]))]
        while len(generated) < n:
            p = len(prompt) + len(generated) - 1
            out = stage.decode([p], [(0,)], tokens=[generated[-1]])
            generated.append(int(np.argmax(out[-1])))
    text = prompt + generated[:-1]
    feed: dict = {"tokens": text}
    kept = None
    if KEPT_KEY in read_header(draft).fields:
        if embeddings is None:
            raise ValueError(f"{draft.name} is a reduced-vocabulary draft: give the file it "
                             "was cut from for its embeddings")
        feed, kept = {"embd": Embedder(embeddings)(text)}, read_kept(draft)
    with Stage(draft, config, final=True, label="probe draft") as stage:
        rows = [i >= len(prompt) - 1 for i in range(len(text))]
        out = stage.decode(range(len(text)), [(0,)] * len(text), logit_rows=rows, **feed)
    guesses = np.argmax(out, axis=1)
    if kept is not None:
        guesses = kept[guesses]
    return float(np.mean(guesses == np.array(generated)))


def _prompt(target: Path) -> list[int]:
    tokenizer = Tokenizer(target)
    try:
        try:
            text = tokenizer.apply_chat_template(PROMPT)
        except LlamaError:  # a model without a chat template: the prompt as it is
            text = PROMPT
        return tokenizer.tokenize(text)
    finally:
        tokenizer.close()
