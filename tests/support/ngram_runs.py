"""The n-gram drafts' exactness runs under mpiexec (test_ngram.py, test_ngram_specpipe.py):
a prompt whose continuation repeats it (CODE_PROMPT, so that n-gram drafts are used and
accepted), a `pipeinfer run` that must succeed, and single-node llama.cpp's greedy tokens
to compare with (`oracle`); conftest.py's code_oracle and smol_self_draft fixtures."""

from __future__ import annotations

from pathlib import Path

from support import mpi_util

CODE_PROMPT = ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
               "def mul(a, b):\n    return a * b\n\nThe same three functions with type "
               "hints:\n\ndef add(a: int, b: int) -> int:\n    return a + b\n\n")
N_CODE = 40
SPLIT = "0,0.5,0.5"


def oracle(model: Path, prompt: list[int], n: int) -> list[int]:
    """Single-node llama.cpp greedy decoding: the whole model, the prompt in the batches
    pipeinfer evaluates it in (prompt_runs), then a token per decode, with the weight layout
    of the runs (--no-repack)."""
    import numpy as np

    from pipeinfer.config.job import PREFILL_CHUNK, PREFILL_TAIL
    from pipeinfer.model.stage import Stage, StageConfig
    from pipeinfer.schedule.speculation import prompt_runs

    config = StageConfig(n_ctx=len(prompt) + n + 1, n_batch=PREFILL_CHUNK, n_seq_max=1,
                         repack=False)
    with Stage(model, config, final=True, label="oracle") as stage:
        for run in prompt_runs(range(len(prompt)), PREFILL_CHUNK, PREFILL_TAIL):
            part = prompt[run.start:run.stop]
            out = stage.decode(list(run), [(0,)] * len(part), tokens=part)
        tokens = [int(np.argmax(out[-1]))]
        while len(tokens) < n:
            out = stage.decode([len(prompt) + len(tokens) - 1], [(0,)], tokens=tokens[-1:])
            tokens.append(int(np.argmax(out[-1])))
    return tokens


def run(n_ranks: int, model, prompt: str, *args, n_predict: int) -> dict:
    res = mpi_util.run_pipeinfer(n_ranks, model, prompt, "--ignore-eos", "--no-repack", *args,
                                 n_predict=n_predict, timeout=120)
    assert res.rc == 0 and res.json is not None, res.describe()
    assert "Traceback" not in res.stderr, res.describe()
    return res.json
