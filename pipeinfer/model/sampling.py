"""Sampling on the head: greedy, or temperature / top-k / top-p with a seeded generator.

The same logits and seed give the same tokens however the model is split over ranks, since
stage outputs are bit-identical to the whole model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temp: float = 0.0       # 0: greedy
    top_k: int = 40         # 0: no limit
    top_p: float = 0.95     # 1: no limit
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temp <= 0


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def distribution(self, logits: np.ndarray) -> np.ndarray:
        """The probabilities the sampler draws from (one-hot when greedy)."""
        p = self.params
        probs = np.zeros(logits.shape[-1], dtype=np.float64)
        if p.greedy:
            probs[int(np.argmax(logits))] = 1.0
            return probs
        order = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            order = order[:p.top_k]
        scaled = logits[order].astype(np.float64) / p.temp
        weights = np.exp(scaled - scaled.max())
        weights /= weights.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(weights), p.top_p) + 1)
            weights = weights[:keep] / weights[:keep].sum()
            order = order[:keep]
        probs[order] = weights
        return probs

    def sample(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(logits))
        probs = self.distribution(logits)
        return int(self.rng.choice(probs.shape[0], p=probs))
