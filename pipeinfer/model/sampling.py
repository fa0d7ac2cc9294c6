"""Sampling on the head, in the order of llama.cpp's sampler chain (common/sampling.cpp):
logit bias, repetition penalties, then top-k, top-p, min-p, temperature and the draw; greedy
(temperature 0) takes the argmax of the biased and penalized logits, as llama.cpp's chain does
(top-k, top-p and min-p never remove the most likely token).

The same logits and seed give the same tokens however the model is split over ranks, since
stage outputs are bit-identical to the whole model's, and the same on a job that resumes the
generation part-way: the draw at each position is keyed by (seed, position). A Sampler is
asked for one token per generated position, in order; penalties need the tokens before that
position (`history`), the prompt included, as llama-server feeds them to its sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

LogitObserver = Callable[[np.ndarray, int], None]
WHOLE_CONTEXT = 1 << 30   # a penalties window of every token so far (repeat_last_n -1)


@dataclass(frozen=True)
class SamplingParams:
    temp: float = 0.0       # 0: greedy
    top_k: int = 40         # 0: no limit
    top_p: float = 0.95     # 1: no limit
    seed: int = 0
    min_p: float = 0.0      # 0: off (llama-server's default is 0.05)
    repeat_penalty: float = 1.0      # 1: off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64          # the penalties' window of tokens (prompt included)
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token, added to its logit)

    @property
    def greedy(self) -> bool:
        return self.temp <= 0

    @property
    def penalized(self) -> bool:
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or
                                            self.frequency_penalty != 0.0 or
                                            self.presence_penalty != 0.0)

    @property
    def adjusts_logits(self) -> bool:
        """Whether logits change before the top-k / top-p / min-p / temperature steps."""
        return self.penalized or bool(self.logit_bias)


def penalize(logits: np.ndarray, window: Sequence[int], p: SamplingParams) -> np.ndarray:
    """llama.cpp's penalties sampler over `window` (the last repeat_last_n tokens): each
    token seen there has its logit divided by repeat_penalty (multiplied, when not positive),
    then lowered by count x frequency_penalty + presence_penalty; float32 throughout."""
    if not len(window):
        return logits
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    inside = (ids >= 0) & (ids < logits.shape[-1])
    ids, counts = ids[inside], counts[inside]
    values = logits[ids]
    repeat = np.float32(p.repeat_penalty)
    values = np.where(values <= 0, values * repeat, values / repeat).astype(np.float32)
    values -= (counts.astype(np.float32) * np.float32(p.frequency_penalty)
               + np.float32(p.presence_penalty))
    logits[ids] = values
    return logits


class Constraint(Protocol):
    """What a Sampler asks of a grammar (model/grammar.py); `allows(token)` optional."""
    def mask(self, logits: np.ndarray) -> np.ndarray: ...
    def accept(self, token: int) -> None: ...


class Sampler:
    """Tokens from logit rows. `history(n)`: the last n tokens before the position being
    sampled (needed when penalties are on); `observe(logits, token)`: told each raw row and
    the token chosen from it (logprobs); `constraint`: the tokens allowed at each position
    (a grammar, advanced with every token chosen), applied after the logit bias and
    penalties, before top-k and the rest."""

    def __init__(self, params: SamplingParams,
                 history: Callable[[int], Sequence[int]] | None = None,
                 observe: LogitObserver | None = None,
                 constraint: Constraint | None = None, position: int = 0):
        """`position`: how many tokens the generation has before the first one this sampler
        draws (a generation resumed after k tokens: k)."""
        if params.penalized and history is None:
            raise ValueError("repetition penalties need the tokens before each position")
        self.params, self.history, self.observe = params, history, observe
        self.constraint = constraint
        self.position = position

    def rng(self) -> np.random.Generator:
        """The draw's generator for the token at `position`: keyed by (seed, position) alone,
        not by the draws before it, so a generation resumed on another job draws the same."""
        return np.random.default_rng([self.params.seed, self.position])

    def adjusted(self, logits: np.ndarray) -> np.ndarray:
        """The logits after the chain's logit bias and penalties (a float32 copy if they
        change anything, else `logits` itself)."""
        p = self.params
        if not p.adjusts_logits:
            return logits
        out = np.array(logits, dtype=np.float32, copy=True)
        for token, bias in p.logit_bias:
            out[token] += np.float32(bias)
        if p.penalized:
            n = p.repeat_last_n if p.repeat_last_n > 0 else WHOLE_CONTEXT
            penalize(out, self.history(n), p)
        return out

    def distribution(self, logits: np.ndarray) -> np.ndarray:
        """The probabilities the sampler draws from (one-hot when greedy), given logits
        already adjusted: top-k, top-p (of the softmax before temperature), min-p (tokens
        at least min_p times as likely as the most likely one), temperature."""
        p = self.params
        probs = np.zeros(logits.shape[-1], dtype=np.float64)
        if p.greedy:
            probs[int(np.argmax(logits))] = 1.0
            return probs
        order = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            order = order[:p.top_k]
        kept = logits[order].astype(np.float64)
        if p.top_p < 1.0:
            weights = np.exp(kept - kept.max())
            keep = int(np.searchsorted(np.cumsum(weights / weights.sum()), p.top_p) + 1)
            order, kept = order[:keep], kept[:keep]
        if p.min_p > 0.0:   # (in float32, as llama.cpp compares logits)
            floor = np.float32(kept[0]) + np.float32(np.log(np.float32(p.min_p)))
            keep = max(1, int(np.sum(kept.astype(np.float32) >= floor)))
            order, kept = order[:keep], kept[:keep]
        scaled = kept / p.temp
        weights = np.exp(scaled - scaled.max())
        probs[order] = weights / weights.sum()
        return probs

    def _allowed_best(self, adjusted: np.ndarray) -> bool:
        """Greedy: whether the grammar allows the likeliest token, which masking could then
        not change (it only lowers the others, and argmax keeps the first of equals), so the
        mask is skipped: one candidate checked costs microseconds, the mask of the whole
        vocabulary 16 ms for Qwen2.5's 151,936 tokens, at every verified position."""
        allows = getattr(self.constraint, "allows", None)
        return (self.params.greedy and allows is not None
                and bool(allows(int(np.argmax(adjusted)))))

    def sample(self, logits: np.ndarray) -> int:
        adjusted = self.adjusted(logits)
        if self.constraint is not None and not self._allowed_best(adjusted):
            adjusted = self.constraint.mask(adjusted)
        if self.params.greedy:
            token = int(np.argmax(adjusted))
        else:
            probs = self.distribution(adjusted)
            token = int(self.rng().choice(probs.shape[0], p=probs))
        self.position += 1
        if self.constraint is not None:
            self.constraint.accept(token)
        if self.observe is not None:
            self.observe(logits, token)
        return token
