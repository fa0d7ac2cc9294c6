"""The tiny models the in-process speculation tests run on: a Q8_0 target, an aligned and an
unrelated draft, every contiguous stage slice of the target, and its single-node greedy
reference (the session's `tiny` fixture, conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import gguf
import numpy as np

from pipeinfer.model.partition import StageRange
from pipeinfer.model.slicing import model_info, open_model, write_stage
from pipeinfer.model.stage import Stage, StageConfig
from support.tinymodel import write_tiny_llama
from pipeinfer.model.tokenizer import Tokenizer

PROMPT = "the number of people in the world"
N_PREDICT = 32
N_CTX = 256
N_BATCH = 64


@dataclass(frozen=True)
class TinySet:
    """The tiny target, its drafts, its stage files and its greedy reference."""
    target: Path
    aligned: Path
    unrelated: Path
    n_layer: int
    n_vocab: int
    prompt: tuple[int, ...]
    reference: tuple[int, ...]          # greedy continuation of the prompt (128 tokens)
    stage_files: dict = field(default_factory=dict)   # (first, last, final) -> Path

    def stage_file(self, first: int, last: int, final: bool) -> Path:
        return self.stage_files[(first, last, final)]

    @property
    def full(self) -> tuple[int, ...]:
        """Prompt followed by the reference continuation."""
        return self.prompt + self.reference


def greedy_reference(model: Path, prompt: Sequence[int], n: int) -> list[int]:
    """Single-node greedy decoding: the whole model, one token per decode."""
    n_ctx = max(N_CTX, len(prompt) + n + 1)
    # (the layout of the in-process stages; the tiny models are F32, which is never repacked)
    config = StageConfig(n_ctx=n_ctx, n_batch=N_BATCH, n_seq_max=1, repack=False)
    with Stage(model, config, final=True, label="reference") as stage:
        out = stage.decode(list(range(len(prompt))), [(0,)] * len(prompt), tokens=list(prompt))
        tokens = [int(np.argmax(out[-1]))]
        while len(tokens) < n:
            pos = len(prompt) + len(tokens) - 1
            out = stage.decode([pos], [(0,)], tokens=[tokens[-1]])
            tokens.append(int(np.argmax(out[-1])))
    return tokens


def make_tiny_set(d: Path, aligned: Path, unrelated: Path) -> TinySet:
    """The target is the tiny model's weights quantized to Q8_0, not the f32 `tiny_model`:
    llama.cpp's f32/f16 matrix products round differently for different batch sizes (a
    4-token batch gives logits up to ~4e-4 away from one-token decodes), so with f32 weights
    a verified speculative batch may legitimately flip a near-tie of the greedy reference
    (seen at token 151 of PROMPT with -np 2 -ps 0 -pa 0). Quantized kernels treat every row
    alike, so Q8_0 logits do not depend on the batch (test_target_is_batch_invariant), as
    with real quantized models. Drafts need no exactness: the f32 ones (conftest.py's
    tiny_draft_aligned and tiny_draft_unrelated) serve. Files are written in `d`."""
    target = write_tiny_llama(d / "tiny-q8.gguf", tensor_type=gguf.GGMLQuantizationType.Q8_0)
    reader = open_model(target)
    info = model_info(reader, target)
    files = {}
    # every contiguous slice, so tests can split the model any way they like
    for first in range(info.n_layer):
        for last in range(first + 1, info.n_layer + 1):
            final = last == info.n_layer
            path = d / f"stage-{first}-{last}.gguf"
            write_stage(reader, info, StageRange(0, first, last, final), path)
            files[(first, last, final)] = path
    tok = Tokenizer(target)
    prompt = tuple(tok.tokenize(PROMPT))
    tok.close()
    reference = greedy_reference(target, prompt, 128)
    return TinySet(target, aligned, unrelated, info.n_layer, info.n_vocab, prompt,
                   tuple(reference), files)
