"""PipeSpec's draft hierarchy on the head (PipeSpec paper, Algorithm 1): models M0 < M1 < ...
< M(k-1), each with its own output buffer O_i and KV cache, interleaved cooperatively.

M0 drafts one token per step. Every Mi (i > 0) verifies, in one batch, up to `window` tokens of
O(i-1) beyond O_i: it appends the tokens it agrees with plus its own next token (a correction
or, when all matched, a bonus), and a rejection rolls every earlier buffer back to O_i. The
target pipeline (schedule/pipespec.py) verifies O(k-1) the same way; its accepted tokens roll
back every buffer. Buffers hold whole token sequences (prompt included) and always satisfy
"O_j extends O_(j+1)" for j < i after a step of model i.

KV: a model's sequence 0 holds entries for a prefix of its buffer (the buffer's last token is
evaluated when it is next needed). Draft numerics do not affect the output (only acceptance),
so rolled-back entries are simply removed; a rollback trims the KV at once, so no stray entries
of rejected tokens stay behind. Draft models always pick greedily.

Also here: PipeSpec's analytic model (equations 1-3) evaluated on measured stage statistics.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ...schedule.buffers import merge
from ...model.stage import Stage


@dataclass
class StageStats:
    """What one model of the hierarchy did (the target's row is filled by the strategy)."""
    model: str
    proposed: int = 0      # tokens of the previous model offered to it (0 for M0)
    accepted: int = 0      # of those, the ones it agreed with
    rejections: int = 0    # verifications that rejected a token (the rest went unchecked)
    produced: int = 0      # tokens it appended to its buffer (drafts, matches, corrections)
    steps: int = 0         # decodes: draft steps (M0) or verification batches
    rollbacks: int = 0     # times a later model rolled its buffer back
    busy_s: float = 0.0    # time in its decodes

    @property
    def rate(self) -> float | None:
        """Per-token acceptance probability (alpha): tokens accepted per token checked, a
        token being checked when every token before it was accepted."""
        checked = self.accepted + self.rejections
        return self.accepted / checked if checked else None

    @property
    def accepted_share(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def step_s(self) -> float | None:
        return self.busy_s / self.steps if self.steps else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.produced / self.busy_s if self.busy_s > 0 else None

    @property
    def window(self) -> float | None:
        """Mean number of tokens checked per verification batch."""
        return self.proposed / self.steps if self.steps and self.proposed else None

    def row(self) -> dict:
        out = asdict(self)
        for key in ("rate", "accepted_share", "step_s", "tokens_per_s", "window"):
            value = getattr(self, key)
            out[key] = None if value is None else round(value, 6)
        out["busy_s"] = round(self.busy_s, 6)
        return out


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class Level:
    """One draft model: its stage, output buffer and KV bookkeeping."""

    def __init__(self, stage: Stage, n_batch: int, name: str | None = None):
        self.stage, self.n_batch = stage, n_batch
        self.out: list[int] = []   # O_i
        self.kv: list[int] = []    # tokens whose entries sequence 0 holds (a prefix of `out`)
        self.stats = StageStats(name or Path(stage.path).name)

    def reset(self, tokens: Sequence[int]) -> None:
        self.stage.seq_rm(0, -1, -1)
        self.kv, self.out = [], list(tokens)

    def set_out(self, tokens: list[int], rollback: bool) -> None:
        """Replace the buffer and drop KV entries that no longer match it."""
        self.out = tokens
        if rollback:
            self.stats.rollbacks += 1
        keep = _common(self.kv, tokens)
        if keep < len(self.kv):
            self.stage.seq_rm(0, keep, -1)
            self.kv = self.kv[:keep]

    def evaluate(self, tokens: Sequence[int], first_row: int, want: bool = True
                 ) -> np.ndarray | None:
        """Make sequence 0 hold `tokens`; return the logits of positions >= first_row (all
        decoded now), or None without `want`."""
        keep = min(_common(self.kv, tokens), first_row)
        if keep < len(self.kv):
            self.stage.seq_rm(0, keep, -1)
        rows = []
        t0 = time.perf_counter()
        for start in range(keep, len(tokens), self.n_batch):
            chunk = list(tokens[start:start + self.n_batch])
            positions = list(range(start, start + len(chunk)))
            mask = [want and p >= first_row for p in positions]
            out = self.stage.decode(positions, [(0,)] * len(chunk), tokens=chunk,
                                    logit_rows=mask)
            if any(mask):
                rows.append(out)
        self.stats.busy_s += time.perf_counter() - t0
        self.kv = list(tokens)
        return np.concatenate(rows) if want else None

    def merge(self, upper: list[int]) -> bool:
        """Make the buffer extend `upper`, a later model's buffer (rollback or catch-up);
        whether it changed."""
        merged = merge(self.out, upper)
        if merged is self.out:
            return False
        rejected = _common(self.out, upper) < min(len(self.out), len(upper))
        self.set_out(merged, rollback=rejected)
        return True

    def draft(self) -> None:
        """One greedy draft token appended to the buffer (M0's step)."""
        logits = self.evaluate(self.out, len(self.out) - 1)
        self.out.append(int(np.argmax(logits[-1])))
        self.stats.produced += 1
        self.stats.steps += 1

    def verify(self, candidates: list[int]) -> int:
        """Check `candidates` (the previous model's tokens after this buffer) in one batch:
        append the ones this model agrees with plus its own next token. Returns how many
        were accepted."""
        base = list(self.out)
        n = len(base)
        logits = self.evaluate(base + candidates, n - 1)
        preds = [int(t) for t in np.argmax(logits, axis=1)]
        m = 0
        while m < len(candidates) and preds[m] == candidates[m]:
            m += 1
        self.set_out(base + candidates[:m] + [preds[m]], rollback=False)
        s = self.stats
        s.proposed += len(candidates)
        s.accepted += m
        s.rejections += m < len(candidates)
        s.produced += m + 1
        s.steps += 1
        return m


class Hierarchy:
    """Draft models M0..M(k-1) (smallest first) sharing the head's core, one step at a time."""

    def __init__(self, stages: Sequence[Stage], n_batch: int, window: int = 4,
                 names: Sequence[str] | None = None):
        if not stages:
            raise ValueError("a PipeSpec hierarchy needs at least one draft model")
        names = names or [None] * len(stages)
        self.levels = [Level(s, n_batch, n) for s, n in zip(stages, names)]
        self.window = window

    @property
    def top(self) -> Level:
        return self.levels[-1]

    def reset(self, tokens: Sequence[int]) -> None:
        for level in self.levels:
            level.reset(tokens)

    def warm(self, tokens: Sequence[int], max_tokens: int) -> bool:
        """Evaluate up to `max_tokens` more of `tokens` on every model (while the target
        prefills the prompt); whether any model evaluated anything."""
        stepped = False
        for level in self.levels:
            done = _common(level.kv, tokens)
            end = min(len(tokens) - 1, done + max_tokens)
            if end > done:
                level.evaluate(tokens[:end], end, want=False)
                stepped = True
        return stepped

    # --- agreement ------------------------------------------------------------------------------
    def sync(self, accepted: Sequence[int]) -> None:
        """The target accepted `accepted`: every buffer must extend it."""
        self._cascade(len(self.levels), list(accepted))

    def _cascade(self, below: int, upper: list[int]) -> None:
        """Make the buffers of models below index `below` extend `upper`, top-down."""
        for level in reversed(self.levels[:below]):
            level.merge(upper)
            upper = level.out

    def finish(self, accepted: Sequence[int]) -> None:
        """The generation ended: every buffer becomes `accepted`, and every KV cache holds
        entries of accepted tokens only (the drafts ahead are dropped)."""
        for level in self.levels:
            level.set_out(list(accepted), rollback=False)

    @property
    def buffer(self) -> list[int]:
        """O(k-1): the last draft model's buffer, what the target verifies."""
        return self.top.out

    # --- work -----------------------------------------------------------------------------------
    def step(self, horizon: int) -> bool:
        """One unit of work: a verification by the latest model with a full window waiting,
        else a draft step of M0 (while its buffer is shorter than `horizon`), else a
        verification of whatever is waiting. False when there is nothing to do."""
        for i in reversed(range(1, len(self.levels))):
            if len(self.levels[i - 1].out) - len(self.levels[i].out) >= self.window:
                self.verify(i)
                return True
        if len(self.levels[0].out) < horizon:
            self.draft()
            return True
        for i in reversed(range(1, len(self.levels))):
            if len(self.levels[i - 1].out) > len(self.levels[i].out):
                self.verify(i)
                return True
        return False

    def draft(self) -> None:
        self.levels[0].draft()

    def verify(self, i: int) -> None:
        level, lower = self.levels[i], self.levels[i - 1]
        n = len(level.out)
        level.verify(lower.out[n:n + self.window])
        self._cascade(i, level.out)

    def rows(self) -> list[dict]:
        return [level.stats.row() for level in self.levels]


# --- PipeSpec's analytic model (paper section 3.3) ----------------------------------------------

def geometric_tokens(alpha: float, gamma: float) -> float:
    """(1 - a^(g+1)) / (1 - a): expected tokens from one verification of a g-token window
    (Leviathan et al.), g + 1 at a = 1."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def steady_state_rho(alpha: float, gamma: float) -> float:
    """Equation 3: the steady-state probability that a model verifies drafts at a step."""
    return alpha / (1.0 - alpha ** (gamma + 1.0) + alpha)


def rho_recursion(alpha: float, gamma: float, steps: int) -> list[float]:
    """Equation 2: rho(t_0) = alpha, rho(t_j) = rho(t_j-1) a^(g+1) + (1 - rho(t_j-1)) a."""
    rho = [alpha]
    for _ in range(steps):
        rho.append(rho[-1] * alpha ** (gamma + 1.0) + (1.0 - rho[-1]) * alpha)
    return rho


def expected_tokens(alpha: float, gamma: float) -> float:
    """Equation 1 with equation 3's rho: E[N(M_i)] = (1 - rho) + rho (1 - a^(g+1)) / (1 - a)."""
    rho = steady_state_rho(alpha, gamma)
    return (1.0 - rho) + rho * geometric_tokens(alpha, gamma)


def expectation(stages: Sequence[dict], default_window: float) -> dict:
    """PipeSpec's expectation from measured per-stage rows (StageStats.row() dicts, smallest
    model first, the target last): for every verifying model, alpha = its acceptance rate,
    gamma = its mean verification window, rho (eq. 3), E[N] tokens per step (eq. 1) and, with
    its measured step time, the expected tokens per second E[N] / t_i. The pipeline's
    expectation is the target's (the last row); `speedup_vs_ar` is its E[N] (tokens per target
    step, against one per step of autoregressive decoding)."""
    per_stage = []
    for row in stages[1:]:
        alpha = row.get("rate")
        if alpha is None:
            per_stage.append({"model": row["model"], "alpha": None})
            continue
        gamma = row.get("window") or default_window
        n = expected_tokens(alpha, gamma)
        step = row.get("step_s")
        per_stage.append({"model": row["model"], "alpha": round(alpha, 6),
                          "gamma": round(gamma, 4),
                          "rho": round(steady_state_rho(alpha, gamma), 6),
                          "tokens_per_step": round(n, 6),
                          "expected_tps": round(n / step, 4) if step else None})
    last = per_stage[-1] if per_stage else {}
    return {"stages": per_stage,
            "speedup_vs_ar": last.get("tokens_per_step"),
            "expected_tps": last.get("expected_tps")}
