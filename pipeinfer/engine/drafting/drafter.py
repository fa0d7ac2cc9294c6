"""The draft model on the head: greedy token trees with a confidence cutoff and branching.

The draft keeps the context it last evaluated in its sequence 0 and only evaluates what
changed, so continuing a speculation costs one draft step per token. Branch b of a tree is
decoded in draft sequence b and dropped afterwards; branch 0 (the greedy path) stays cached.

Under a front (serve --ranks) a request's draft context is also kept on the head's disk
(model/kept_cells.py; engine/head/kept.py names the request): every KEEP_EVERY tokens the
draft model gains, sequence 0's cells and their tokens are written, on the thread that
evaluated them; the job started after a failure takes them back, so a resumed request's
draft reads only what follows them. The draft's cells only choose what is guessed, never
the output, so a copy needs no exact run sizes: only the same draft file and settings.
"""

from __future__ import annotations

import itertools
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from ...model.draft_vocab_stage import DraftVocab
from ...model.kept_cells import KeptCells, token_digest
from ...model.row_costs import row_cost
from ...model.stage import Stage, StageAborted


# Catching up on a long context (the prompt, while the target prefills it) goes in steps, and
# the head checks for waiting results between them, so it is never kept from the target's
# results by more than about one step: steps of at most WARM_STEP tokens, and (once the draft's
# speed is known) of about WARM_STEP_S seconds.
WARM_STEP = 32
WARM_STEP_S = 0.015
# ... and of at least MIN_STEP tokens: a step's time hardly grows with its tokens (the weights
# are read once), and a job the scheduler stops at once (a stage idles) takes one step, so
# the draft must gain more per step than the target accepts per job, or it never catches up.
MIN_STEP = 8

# Tokens a request's draft context gains between two copies of it: each copy is the whole
# context, written on the head, whose CPU speculation runs on; a resumed request's draft
# reads at most about this many again.
KEEP_EVERY = 64


@dataclass(frozen=True)
class DraftParams:
    max_tokens: int = 4        # tree depth limit (micro-batch size for a single branch)
    p_split: float = 0.1       # fork a branch when the runner-up candidate is above this
    n_parallel: int = 1        # at most this many branches
    # what rows 2, 3, ... of a run cost its slowest stage against a run of one row
    # (model/row_costs.py): a branch stops before a token less likely to be reached
    row_costs: tuple[float, ...] = ()


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = np.exp(z - z.max())
    return z / z.sum()


def _pays(p: float, cutoff: float, reach: float, row: int, row_costs) -> bool:
    """Whether a token of draft probability `p` goes into a branch as the run's `row`-th
    row: at least the cutoff, and (from the second row on) likely enough to be reached (the
    branch's probability so far, `reach`, times p) to pay for what its row costs against a
    run of its own (`row_costs`)."""
    return p >= cutoff and reach * p >= row_cost(row_costs, row)


class _Tree:
    """The branches Drafter.draft grows: branch b lives in the draft's sequence b; `logits[b]`
    follow its last evaluated token, `reach[b]` is the product of its tokens' draft
    probabilities, `main_probs` those of branch 0's tokens; `last_evaluated`: branch 0's last
    token has been evaluated (logits[0] follow it); `stopped`: branch 0 may not grow."""

    def __init__(self, logits: list):
        self.logits: list = logits
        self.branches: list[list[int]] = [[]]
        self.active, self.reach = [True], [1.0]
        self.main_probs: list[float] = []
        self.last_evaluated, self.stopped = True, False

    def extend(self, b: int, token: int, p: float) -> None:
        self.branches[b].append(token)
        self.reach[b] *= p
        if b == 0:
            self.main_probs.append(p)
            self.last_evaluated = False

    def fork(self, b: int, token: int, p: float) -> None:
        """A new branch: branch b so far, then `token` (its runner-up, of probability p)."""
        self.branches.append(self.branches[b] + [token])
        self.reach.append(self.reach[b] * p)
        self.active.append(True)
        self.logits.append(None)


def candidates(logits: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The draft's choice at one position: the probabilities, the likeliest token and the
    runner-up (plan/measure.py times this as part of a drafted token)."""
    probs = _softmax(logits)
    first, second = sorted(np.argpartition(-probs, 1)[:2], key=lambda t: -probs[t])
    return probs, int(first), int(second)


class Drafter:
    """`vocab`: the stage is a reduced-vocabulary draft (model/draft_vocab_stage.py) whose
    logits columns stand for the tokens `vocab.kept`; None: columns are token ids."""

    def __init__(self, stage: Stage, n_batch: int, vocab: DraftVocab | None = None):
        self.stage = stage
        self.n_batch = n_batch
        self.vocab = vocab
        self.ctx: list[int] = []              # tokens held in draft sequence 0
        self._last: np.ndarray | None = None  # draft logits after self.ctx, when known
        self.busy_s = 0.0
        self.evaluated = 0   # tokens the draft model evaluated so far (its work, for the guard)
        self._s_per_token: float | None = None  # measured cost of one context token
        self.interrupted = False   # the last draft() was stopped while catching up, or aborted
        self._run_id = 0   # the run id of the draft's decodes now (a job's while it runs)
        self._runs = itertools.count(1)
        self._keeping: tuple[KeptCells, int] | None = None   # (store, request key)
        self._kept_n = 0                  # len(ctx) at the last copy
        self._taken: bytes | None = None  # cells taken back, put in at the next use
        # While the guard asks (a probe after a pause): the cutoff under which the draft's
        # agreement with the tokens it catches up on is scored, and the score so far
        # (positions scored, those where its likeliest next token reaches the cutoff, those of
        # them where it is the token that followed): what speculating would have guessed, and
        # been right about.
        self.scoring: float | None = None
        self.agreement = [0, 0, 0]

    def reset(self) -> None:
        """Forget every cached token: a new generation of the job begins."""
        self._taken = None
        self.stage.clear()
        self.ctx, self._last = [], None

    # --- a request's context kept across a failure ---------------------------------------
    def keep_as(self, store: KeptCells | None, key: int = 0) -> None:
        """Keep copies of sequence 0 for request `key` in `store` from now on (None: stop).
        Called while no draft job runs (before the request's draft thread starts, after it
        closed)."""
        self._keeping = (store, key) if store is not None and key else None
        self._kept_n = -KEEP_EVERY   # (the first copy at the next evaluation: the prompt)

    def take_back(self, tokens: Sequence[int], cells: bytes) -> None:
        """Hold a kept copy: sequence 0 gets `cells` (of `tokens`) at the draft model's next
        use, on the thread that uses it (the model may still be loading now)."""
        self.ctx, self._last, self._taken = list(tokens), None, cells

    def _put_back(self) -> None:
        if self._taken is None:
            return
        cells, self._taken = self._taken, None
        self.stage.clear()
        if not self.stage.set_seq_state(0, cells):   # (llama.cpp refused it: read again)
            self.stage.clear()
            self.ctx = []

    def _keep(self) -> None:
        """Write sequence 0's copy if the context grew by KEEP_EVERY since the last (or
        since it was cut back to fewer tokens than the last held)."""
        self._kept_n = min(self._kept_n, len(self.ctx))   # (a wrong guess was cut off)
        if self._keeping is None or len(self.ctx) - self._kept_n < KEEP_EVERY:
            return
        store, key = self._keeping
        store.save(key, len(self.ctx), token_digest(self.ctx), self.stage.seq_state(0),
                   tokens=self.ctx)
        self._kept_n = len(self.ctx)

    def _common(self, context: Sequence[int]) -> int:
        """How many leading tokens of `context` the draft's sequence 0 already holds."""
        common, limit = 0, min(len(self.ctx), len(context))
        while common < limit and self.ctx[common] == context[common]:
            common += 1
        return common

    def _sync(self, context: Sequence[int], want_logits: bool = True) -> np.ndarray | None:
        """Make sequence 0 hold `context`; return the logits after its last token (None
        without `want_logits`)."""
        self._put_back()
        common = self._common(context)
        if common == len(context) == len(self.ctx) and self._last is not None:
            return self._last
        keep = min(common, len(context) - 1)
        self.stage.seq_rm(0, keep, -1)
        logits = None
        for start in range(keep, len(context), self.n_batch):
            chunk = list(context[start:start + self.n_batch])
            last = want_logits and start + len(chunk) == len(context)
            t0 = time.perf_counter()
            self.evaluated += len(chunk)
            scored = self.scoring is not None
            rows = [scored or (last and i == len(chunk) - 1) for i in range(len(chunk))]
            try:
                out = self.stage.decode(list(range(start, start + len(chunk))),
                                        [(0,)] * len(chunk), tokens=chunk, logit_rows=rows,
                                        run_id=self._run_id)
            except StageAborted:   # (the chunk's cells are gone: those before it stay)
                self.ctx, self._last = list(context[:start]), None
                raise
            self._s_per_token = (time.perf_counter() - t0) / len(chunk)
            if scored:
                self._score(out, context[start + 1:start + len(chunk) + 1])
            if last:
                logits = out[-1]
        self.ctx, self._last = list(context), logits
        self._keep()
        return logits

    def _score(self, rows: np.ndarray, following: Sequence[int]) -> None:
        """Add to `agreement` the rows (logits after each token caught up on) whose next token
        is known (`following`): confident where the likeliest token's probability reaches
        `scoring`, right where it is that token."""
        z = rows[:len(following)].astype(np.float32)
        if not len(z):
            return
        best = z.argmax(axis=1)
        top = 1.0 / np.exp(z - z[np.arange(len(z)), best][:, None]).sum(axis=1)
        self.agreement[0] += len(z)
        for p, column, token in zip(top, best, following):
            if p >= self.scoring:
                self.agreement[1] += 1
                self.agreement[2] += self.token(column) == token

    def sync(self, context: Sequence[int]) -> np.ndarray:
        """Make sequence 0 hold `context`; the draft's logits after it."""
        return self._sync(context)

    def token(self, column: int) -> int:
        """The token id of logits column `column`."""
        return int(column) if self.vocab is None else self.vocab.token(column)

    def full_row(self, row: np.ndarray) -> np.ndarray:
        """A logits row indexed by token id (a reduced draft's kept columns spread out)."""
        return row if self.vocab is None else self.vocab.full_row(row)

    @property
    def n_held(self) -> int:
        """How many tokens sequence 0 holds."""
        return len(self.ctx)

    def adopt(self, seq: int, token: int) -> None:
        """Append `token` to sequence 0, taking the KV entry that sequence `seq` already holds
        for that position (no decode)."""
        self._put_back()
        pos = len(self.ctx)
        self.stage.seq_cp(seq, 0, pos, pos + 1)
        self.ctx, self._last = self.ctx + [token], None

    def prepare(self, context: Sequence[int], max_tokens: int | None = None,
                timed: bool = True) -> None:
        """Evaluate `context` now, or only its next `max_tokens` tokens not evaluated yet: the
        head warms the draft up on the prompt in such steps while the target prefills it, so
        the first token is not kept waiting for the draft (drafting later does the rest).
        `timed`: steps also of about WARM_STEP_S (the head's own thread waits for each);
        a draft thread steps by tokens only, as nothing waits for it but its closing."""
        if timed and max_tokens is not None:  # the first step measures the draft's speed
            in_time = 0 if self._s_per_token is None else int(WARM_STEP_S / self._s_per_token)
            max_tokens = min(max_tokens, max(MIN_STEP, in_time))
        if max_tokens is None or len(context) - self._common(context) <= max_tokens:
            self._sync(context)
            return
        done = self._common(context) + max_tokens
        self._sync(context[:done], want_logits=False)

    def warm_step(self, prompt: Sequence[int]) -> bool:
        """One warm-up step on `prompt` (prepare's, of WARM_STEP tokens at most); whether it
        evaluated anything: False once the draft holds the prompt."""
        held = self._common(prompt)
        if held >= len(prompt):
            return False
        self.prepare(prompt, max_tokens=WARM_STEP)
        return self.n_held > held   # (prepare leaves a prefix of the prompt held)

    def draft(self, context: Sequence[int], params: DraftParams, cutoff: float,
              max_tokens: int | None = None, should_stop: Callable[[], bool] | None = None,
              stop_at: Callable[[list[int]], bool] | None = None, room: int | None = None
              ) -> tuple[list[list[int]], list[float]]:
        """Branches continuing `context` (branch 0 first) and the draft probability of each
        token of branch 0; empty when the first guess is under `cutoff`. `should_stop`
        (asked after every step) ends drafting with the tree so far: a ready micro-batch goes
        out rather than wait (paper IV-B); while catching up on a long context, it gives
        nothing (progress is kept). `stop_at(branch 0)`, asked after each token branch 0
        gains, ends drafting after it (where a grammar forces the rest, which
        engine/drafting/grammar_drafts.py drafts without the model, up to `room`: unused here).
        Inside `running`, another thread may abort it: then it gives nothing (`interrupted`),
        and sequence 0 holds what was evaluated before the aborted decode."""
        limit = params.max_tokens if max_tokens is None else max_tokens
        self.interrupted = False
        try:
            if limit <= 0 or not self._catch_up(context, should_stop):
                return [], []
            tree = _Tree([self._sync(context)])
            for depth in range(limit):
                grown = self._grow(tree, depth, cutoff, params, stop_at)
                if not grown or depth + 1 == limit or tree.stopped:
                    break
                if should_stop is not None and should_stop():
                    break
                self._evaluate(tree, grown, len(context) + depth)
        except StageAborted:
            self._aborted(params.n_parallel)
            return [], []
        self._finish(context, tree.branches, tree.logits[0] if tree.last_evaluated else None)
        return [br for br in tree.branches if br], tree.main_probs

    @contextmanager
    def running(self) -> Iterator[int]:
        """The draft's decodes inside run under a run id of their own (yielded), which
        `abort` ends from another thread: the draft() under way then gives nothing."""
        self._run_id = next(self._runs)
        try:
            yield self._run_id
        finally:
            self._run_id = 0

    def abort(self, run_id: int) -> None:
        """End the decode of `run_id` under way (or its next): thread-safe (Stage.cancel)."""
        self.stage.cancel(run_id)

    def _aborted(self, n_branches: int) -> None:
        """After an aborted decode (whose batch's cells llama.cpp's caller dropped): the side
        branches dropped, sequence 0 cut back to the tokens `ctx` says it holds."""
        for b in range(1, n_branches):
            self.stage.seq_rm(b, -1, -1)
        self.stage.seq_rm(0, len(self.ctx), -1)
        self._last = None
        self.interrupted = True

    def _grow(self, tree: "_Tree", depth: int, cutoff: float, params: DraftParams,
              stop_at: Callable[[list[int]], bool] | None) -> list[int]:
        """Each active branch gains its likeliest next token if it pays (else it ends), and
        forks on the runner-up where that is likely enough and the tree has room; the
        branches that gained a token, whose new tokens the draft evaluates next."""
        grown = []
        for b in range(len(tree.branches)):
            if not tree.active[b]:
                continue
            probs, first, second = candidates(tree.logits[b])
            reach = tree.reach[b]
            if not _pays(probs[first], cutoff, reach, depth + 1, params.row_costs):
                tree.active[b] = False
                continue
            if (len(tree.branches) < params.n_parallel and probs[second] > params.p_split
                    and _pays(probs[second], cutoff, reach, depth + 1, params.row_costs)):
                self.stage.seq_cp(b, len(tree.branches), -1, -1)
                tree.fork(b, self.token(second), float(probs[second]))
                grown.append(len(tree.branches) - 1)
            tree.extend(b, self.token(first), float(probs[first]))
            if b == 0:
                tree.stopped = stop_at is not None and stop_at(tree.branches[0])
            grown.append(b)
        return grown

    def _evaluate(self, tree: "_Tree", grown: list[int], position: int) -> None:
        """The draft model evaluates the last token of each branch in `grown` (all at
        `position`, each in its branch's sequence) for the logits of the next step."""
        grown.sort()
        self.evaluated += len(grown)
        out = self.stage.decode([position] * len(grown), [(b,) for b in grown],
                                tokens=[tree.branches[b][-1] for b in grown],
                                run_id=self._run_id)
        for row, b in enumerate(grown):
            tree.logits[b] = out[row]
        tree.last_evaluated = tree.last_evaluated or 0 in grown

    def _catch_up(self, context: Sequence[int], should_stop: Callable[[], bool] | None) -> bool:
        """Evaluate a long unevaluated tail of `context` in WARM_STEP steps, asking
        `should_stop` after each; False (and `interrupted`) when it said stop."""
        while should_stop is not None and len(context) - self._common(context) > WARM_STEP:
            self.prepare(context, max_tokens=WARM_STEP)
            if should_stop():
                self.interrupted = True
                return False
        return True

    def _finish(self, context: Sequence[int], branches: list[list[int]],
                last_logits: np.ndarray | None) -> None:
        """Drop the side branches; keep branch 0 in sequence 0 as the new cached context."""
        for b in range(1, len(branches)):
            self.stage.seq_rm(b, -1, -1)
        main = branches[0]
        self.ctx = list(context) + (main if last_logits is not None else main[:-1])
        self._last = last_logits
        self._keep()
