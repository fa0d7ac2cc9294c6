"""How often the draft model guesses the target's next token: a short greedy probe on one
node (at most PROBE_TOKENS tokens) on a built-in coding chat prompt, cached per model pair."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from ..model.llama_lib import LlamaError
from ..model.models import cache_dir
from ..model.stage import Stage, StageConfig
from ..model.stage_cache import content_digest
from ..model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PROBE_TOKENS = 64
PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
          "category) and returns the total amount per category, sorted by amount.")


def accept_rate(target: Path, draft: Path, n: int = PROBE_TOKENS) -> float:
    """Share of the target's greedy tokens the draft, fed the same text, predicts greedily."""
    key = f"accept-{content_digest(target)[:16]}-{content_digest(draft)[:16]}-{n}.json"
    where = cache_dir() / "profiles" / key
    try:
        return float(json.loads(where.read_text())["accept_rate"])
    except (OSError, ValueError, KeyError):
        pass
    log.info("probing the draft's agreement with the target (%d tokens)", n)
    rate = _probe(target, draft, n)
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_name(where.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"accept_rate": rate}))
    os.replace(tmp, where)
    return rate


def _probe(target: Path, draft: Path, n: int) -> float:
    tokenizer = Tokenizer(target)
    try:
        try:
            text = tokenizer.apply_chat_template(PROMPT)
        except LlamaError:  # a model without a chat template: the prompt as it is
            text = PROMPT
        prompt = tokenizer.tokenize(text)
    finally:
        tokenizer.close()
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
    with Stage(draft, config, final=True, label="probe draft") as stage:
        rows = [i >= len(prompt) - 1 for i in range(len(text))]
        out = stage.decode(range(len(text)), [(0,)] * len(text), tokens=text, logit_rows=rows)
    guesses = np.argmax(out, axis=1)
    return float(np.mean(guesses == np.array(generated)))
