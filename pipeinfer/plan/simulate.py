"""The scheduler core (pipeinfer/schedule/) driven by a discrete-event clock with modelled costs.

The very scheduler classes `run` uses make every decision (`Scheduler.step(event) ->
actions`); this module only stands in for the driver, the stages, the links and the draft
model, with times from a cost.Pipeline:
- the prompt goes in as the scheduler's chunks, all sent at once, so the stages work on
  different chunks at the same time; only the last chunk's last row gives logits;
- a stage evaluates the runs it receives one at a time, in order, k x layer(n) (+ the output
  layer for the rows that give logits on the last stage) for a run of n tokens, then sends
  it on (half a round trip plus the transfer at the link's bandwidth); the last stage returns
  those rows' argmaxes to the head;
- cancellations travel backwards from the last stage; a stage skips a run whose cancellation
  arrived before it started and aborts one it is computing when it arrives;
- the head's own slice (if it holds layers) and its draft model share the head's CPU: each
  drafted token takes draft_ms of it, one after the other, more on a head with little more
  than a core or less, where the head's loop takes its part (cost.HEAD_LOOP_CORES);
- a rank that was idle sees a message only when its polite poll wakes: `run`'s waits sleep
  longer the longer they have been idle (engine/backoff.IdleBackoff: 1 % of the idle time,
  between 0.25 and 5 ms), so a message waits half such a sleep on average. That is the
  worker receiving a run and the head's loop receiving a result or a finished draft;
- the target's greedy continuation is a fixed token sequence; the draft guesses the token at
  position p right with probability `accept_rate` (one draw per position, seeded, so a draft
  asked twice at a position answers the same), and wrong after a wrong context.
Nothing decodes and no clock is read: the same inputs give the same timeline. What it is
given and what it answers: sim_config.py.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

import numpy as np

from .. import strategies
from ..engine.transport.backoff import IDLE_LATENCY_SHARE, MAX_SLEEP_S, IdleBackoff
from ..schedule import actions as A
from ..schedule.events import DraftReady, ResultArrived, Start, Tick
from ..schedule.generation import Generation, Request
from ..schedule.options import Limits
from ..schedule.partition_pool import PartitionPool
from ..schedule.transaction import RunResult
from .cost import Pipeline, drafts_on_thread
from .sim_config import SimConfig, SimResult, SimulationError, check

__all__ = ["SimConfig", "SimResult", "SimulationError", "Simulation", "simulate", "wake_s"]

WRONG = 10 ** 6           # draft tokens from here on are never the target's
FIRST_TOKEN = 1000        # the target's token at position p is FIRST_TOKEN + p
MAX_TICKS = 16            # ticks per event at most (the driver ticks while idle)
MIN_SLEEP_S = IdleBackoff().base_limit


def wake_s(idle_s: float) -> float:
    """Mean delay before a rank idle for `idle_s` sees a message: half its sleep then."""
    return min(MAX_SLEEP_S, max(MIN_SLEEP_S, IDLE_LATENCY_SHARE * idle_s)) / 2


class Simulation:
    """One generation of `cfg.strategy` on `pipe` with `counts` layers per rank."""

    def __init__(self, pipe: Pipeline, counts: list[int], cfg: SimConfig):
        check(pipe, counts, cfg)
        self.pipe, self.counts, self.cfg = pipe, list(counts), cfg
        self.chain = [r for r in range(1, len(counts)) if counts[r] > 0]
        self.last = max(r for r, c in enumerate(counts) if c > 0)
        rng = random.Random(cfg.seed)
        self.agree = [rng.random() < cfg.accept_rate for _ in range(cfg.context + 64)]
        self.now = 0.0
        self._queue: list = []
        self._seq = itertools.count()
        self.stages = {r: _StageState() for r in self.chain}
        self.head_free = 0.0       # the head's CPU: its slice and its draft model
        self.busy = [0.0] * len(counts)
        self.cancel_at: dict[tuple[int, int], float] = {}
        self.dropped: set[int] = set()   # runs a stage skipped or aborted
        self.link_free: dict[int, float] = {}  # per sender: its last message's arrival
        self.head_last = 0.0       # the head's loop last had something to do
        self.head_wake = 0.0       # its pending wake-up (messages until then are seen then)
        self.job = None            # the draft job in progress: [DraftJob, drafted, stop]
        self.draft_ms = pipe.nodes[0].draft_step_ms(drafts_on_thread(cfg.strategy))
        self.marks: list[float] = []
        self.gen = Generation(Request(tuple(FIRST_TOKEN + p for p in range(cfg.prompt_len)),
                                      cfg.n_predict, cfg.context, ignore_eos=True),
                              lambda t: False)
        self.sched = self._scheduler()

    def _scheduler(self):
        cfg, spec = self.cfg, self.cfg.spec
        n_stages = len(self.chain) + (1 if self.counts[0] else 0)
        speculates = strategies.get(cfg.strategy).speculates
        kv = (spec.kv_size or 4 * cfg.context) if speculates else cfg.context
        limits = Limits(cfg.n_batch, cfg.context, kv, n_stages, cfg.max_run, cfg.chunk,
                        cfg.prefill_tail)
        pool = PartitionPool(spec.partitions, spec.n_parallel) if speculates else None
        sched = strategies.get(cfg.strategy).scheduler_class()(self.gen, None, limits, spec, pool)
        sched.guard.clock = lambda: self.now   # the guard times tokens on the simulated clock
        return sched

    # --- the event loop --------------------------------------------------------------------
    def run(self) -> SimResult:
        self._feed(Start())
        while not self.sched.finished or self.sched.in_flight:
            if not self._queue:
                raise SimulationError("the simulated pipeline stalled (no event pending)")
            self.now, _, kind, data = heapq.heappop(self._queue)
            getattr(self, "_on_" + kind)(*data)
        return self._result()

    def _at(self, t: float, kind: str, *data) -> None:
        heapq.heappush(self._queue, (t, next(self._seq), kind, data))

    def _feed(self, event) -> None:
        self.head_last = self.now
        self._apply(self.sched.step(event))
        for _ in range(MAX_TICKS):
            if self.sched.finished or not self._apply(self.sched.step(Tick())):
                break

    def _apply(self, actions) -> bool:
        """Carry out the scheduler's actions; whether any did something."""
        acted = False
        for action in actions:
            if isinstance(action, A.StartRun):
                self._start_run(action)
            elif isinstance(action, A.CancelRuns):
                self._cancel(action.run_ids)
            elif isinstance(action, A.EmitTokens):
                self.marks.extend([self.now] * len(action.tokens))
            elif isinstance(action, A.StartDraft):
                self._start_draft(action.job)
            elif isinstance(action, A.StopDraft):
                # (a stale stop aborts the draft step under way on a real head; here every
                # stop ends the job after its step: the head's time is one queue here, and a
                # step taken out of it would move what is queued behind it)
                if self.job is not None and self.job[0].job_id == action.job_id:
                    self.job[2] = True
            else:
                continue  # KV operations cost nothing here; warm-up, finish, policy notes
            acted = True
        return acted

    # --- runs through the stages -----------------------------------------------------------
    def _start_run(self, action: A.StartRun) -> None:
        tx = action.tx
        t = self.now
        if self.counts[0]:
            t = self._head_compute(self._compute_ms(0, tx))
        if self.last == 0:
            self._at(t, "seen", tx)
            return
        self._send(0, t, self._bytes(0, tx), "arrive", self.chain[0], tx)

    def _compute_ms(self, rank: int, tx) -> float:
        """Rank `rank`'s time for run `tx`: its layers for every token, the output layer (on
        the last stage) for the rows that give logits only: one of a prompt's last chunk."""
        return self.pipe.stage_ms(rank, self.counts[rank], rank == self.last, tx.n_tokens,
                                  tx.n_outputs)

    def _bytes(self, rank: int, tx) -> int:
        """What rank `rank` sends on for `tx`: its hidden states, or from the last stage the
        argmax of each row that gives logits."""
        return 4 * tx.n_outputs if rank == self.last else self.pipe.model.hidden_bytes * tx.n_tokens

    def _send(self, rank: int, t: float, n_bytes: int, kind: str, *data) -> None:
        """A message from `rank` leaving at `t`: it arrives a hop later, never before one
        it sent earlier (MPI messages between two ranks do not overtake)."""
        hop = self.pipe.nodes[rank].hop_ms(n_bytes) / 1e3
        arrival = max(t + hop, self.link_free.get(rank, 0.0))
        self.link_free[rank] = arrival
        self._at(arrival, kind, *data)

    def _head_compute(self, ms: float) -> float:
        start = max(self.now, self.head_free)
        self.head_free = start + ms / 1e3
        self.busy[0] += ms / 1e3
        return self.head_free

    def _on_arrive(self, rank: int, tx) -> None:
        stage = self.stages[rank]
        stage.todo.append(tx)
        if stage.current is None and not stage.waking:
            stage.waking = True
            self._at(self.now + self._wake(self.now - stage.idle_since), "wake", rank)

    def _on_wake(self, rank: int) -> None:
        stage = self.stages[rank]
        stage.waking = False
        if stage.current is None:
            self._next_on(rank)

    def _wake(self, idle_s: float) -> float:
        return wake_s(idle_s) if self.cfg.idle_sleep else 0.0

    def _head_sees(self, kind: str, *data) -> None:
        """An event for the head's loop, seen when its idle poll next wakes."""
        if self.head_wake <= self.now:
            self.head_wake = self.now + self._wake(self.now - self.head_last)
        self._at(self.head_wake, kind, *data)

    def _next_on(self, rank: int) -> None:
        stage = self.stages[rank]
        if not stage.todo:
            stage.current, stage.idle_since = None, self.now
            return
        tx = stage.todo.pop(0)
        skip = self.cancel_at.get((tx.run_id, rank), float("inf")) <= self.now
        ms = 0.0 if skip else self._compute_ms(rank, tx)
        stage.current, stage.started, stage.version = tx, self.now, stage.version + 1
        stage.skipped = skip
        self._at(self.now + ms / 1e3, "done", rank, tx, stage.version)

    def _on_done(self, rank: int, tx, version: int) -> None:
        stage = self.stages[rank]
        if version != stage.version:
            return  # aborted meanwhile: an earlier "done" took its place
        self.busy[rank] += self.now - stage.started
        skipped = stage.skipped
        self._next_on(rank)
        if rank == self.last:
            self._send(rank, self.now, self._bytes(rank, tx), "result", tx, skipped)
        else:
            nxt = self.chain[self.chain.index(rank) + 1]
            self._send(rank, self.now, 0 if skipped else self._bytes(rank, tx), "arrive", nxt,
                       tx)
        if skipped:  # downstream stages skip it too (an empty message travels on)
            self.dropped.add(tx.run_id)
            for later in self.chain[self.chain.index(rank) + 1:]:
                self.cancel_at[(tx.run_id, later)] = -1.0

    def _on_result(self, tx, skipped: bool = False) -> None:
        self._head_sees("seen", tx, skipped)

    def _on_seen(self, tx, skipped: bool = False) -> None:
        if skipped or tx.run_id in self.dropped:
            result = RunResult(tx.run_id, None)
        else:
            rows = [FIRST_TOKEN + p + 1 for p, out in zip(tx.positions, tx.logit_rows) if out]
            result = RunResult(tx.run_id, None, np.array(rows, dtype=np.int32))
        self._feed(ResultArrived(tx.run_id, result))

    def _cancel(self, run_ids) -> None:
        """Cancellations from the head to the last stage, then backwards stage by stage."""
        t = self.now
        for rank in reversed(self.chain):
            t += self.pipe.nodes[rank].link_rtt_ms / 2e3
            for run_id in run_ids:
                self.cancel_at[(run_id, rank)] = min(t, self.cancel_at.get((run_id, rank), t))
                self._at(t, "cancel", rank, run_id)

    def _on_cancel(self, rank: int, run_id: int) -> None:
        stage = self.stages[rank]
        if stage.current is not None and stage.current.run_id == run_id and not stage.skipped:
            stage.skipped, stage.version = True, stage.version + 1
            self._at(self.now, "done", rank, stage.current, stage.version)

    # --- the draft model ------------------------------------------------------------------
    def _start_draft(self, job: A.DraftJob) -> None:
        self.job = [job, [], False]
        self._draft_step()

    def _draft_step(self) -> None:
        end = self._head_compute(self.draft_ms)
        self._at(end, "drafted", self.job[0].job_id)

    def _on_drafted(self, job_id: int) -> None:
        job, tokens, _ = self.job
        context = job.context
        p = len(context) + len(tokens)
        right = all(t == FIRST_TOKEN + i for i, t in enumerate(list(context) + tokens))
        tokens.append(FIRST_TOKEN + p if right and self.agree[p] else WRONG + p)
        if len(tokens) < job.budget and not self.job[2]:
            self._draft_step()
            return
        self.job = None
        self._head_sees("draft_ready", job_id, tuple(tokens))

    def _on_draft_ready(self, job_id: int, tokens: tuple) -> None:
        self._feed(DraftReady(job_id, (tokens,)))

    # --- results ----------------------------------------------------------------------------
    def _result(self) -> SimResult:
        """The figures from the times the tokens were emitted: the first one's is TTFT (the
        prompt's evaluation and the first token from its last row)."""
        marks = self.marks
        if len(marks) < 2:
            raise SimulationError("the simulated generation produced fewer than 2 tokens")
        ttft = marks[0]
        gen_s = marks[-1] - ttft
        n = len(marks) - 1
        c = self.gen.counters
        return SimResult(n / gen_s if gen_s > 0 else float("inf"), ttft, gen_s / n,
                         marks[1] - ttft, len(marks), c.accept_rate, self.cfg.prompt_len,
                         self.busy, {"n_drafted": c.n_drafted, "n_accepted": c.n_accepted,
                                     "runs_started": c.runs_started,
                                     "runs_cancelled": c.runs_cancelled_invalidated
                                     + c.runs_cancelled_superfluous})


@dataclass
class _StageState:
    todo: list = field(default_factory=list)
    current: object = None
    started: float = 0.0
    version: int = 0
    skipped: bool = False
    waking: bool = False
    idle_since: float = 0.0


def simulate(pipe: Pipeline, counts: list[int], cfg: SimConfig) -> SimResult:
    return Simulation(pipe, counts, cfg).run()
