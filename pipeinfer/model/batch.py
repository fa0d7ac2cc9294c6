"""A llama_batch allocated once per context and refilled through numpy views of its arrays
(what Stage.decode hands llama.cpp)."""

from __future__ import annotations

import llama_cpp
import numpy as np


class Batch:
    """A llama_batch allocated once and refilled through numpy views of its arrays."""

    def __init__(self, capacity: int, n_embd: int, n_seq_max: int):
        self.capacity, self.n_embd, self.n_seq_max = capacity, n_embd, n_seq_max
        self.batch = llama_cpp.llama_batch_init(capacity, n_embd, n_seq_max)
        b = self.batch
        self.pos = np.ctypeslib.as_array(b.pos, shape=(capacity,))
        self.n_seq_id = np.ctypeslib.as_array(b.n_seq_id, shape=(capacity,))
        self.logits = np.ctypeslib.as_array(b.logits, shape=(capacity,))
        self.seq_id = [np.ctypeslib.as_array(b.seq_id[i], shape=(n_seq_max,))
                       for i in range(capacity)]
        self.embd = np.ctypeslib.as_array(b.embd, shape=(capacity, n_embd)) if n_embd else None
        self.token = None if n_embd else np.ctypeslib.as_array(b.token, shape=(capacity,))

    def fill(self, positions, seq_ids, rows, *, embd=None, tokens=None) -> None:
        n = len(positions)
        self.batch.n_tokens = n
        self.pos[:n] = positions
        self.logits[:n] = rows
        for i, seqs in enumerate(seq_ids):
            if not 0 < len(seqs) <= self.n_seq_max:
                raise ValueError(f"token {i}: {len(seqs)} sequence ids (1..{self.n_seq_max})")
            self.n_seq_id[i] = len(seqs)
            self.seq_id[i][:len(seqs)] = seqs
        if embd is not None:
            if embd.shape != (n, self.n_embd):
                raise ValueError(f"activations of shape {embd.shape}, expected {(n, self.n_embd)}")
            self.embd[:n] = embd
        else:
            self.token[:n] = tokens

    def free(self) -> None:
        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
