"""SpecPipe / PipeDec: pipelined speculative decoding over a fixed-width dynamic prediction tree
(SpecPipe 3.3, PipeDec 3.3). Exact under greedy sampling, lossless under sampling.

The schedule. `depth` runs stay in flight (the target stages + 1, the extra one waiting at the
first stage while the head drafts; at most --max-runs), each holding one tree level: a level's
run starts whenever fewer are in flight. A level: every bottom node's --tree-k likeliest draft
tokens, of which the --tree-width with the highest cumulative draft probability survive
(SpecPipe 3.3.3; n-gram drafts name few candidates: a level may be narrower, or none grows until
the next root). The draft evaluates a level's nodes in one job once the level is out, also when
the pipeline is full. The run holding the newest accepted node A gives, in A's row, the target's
next token t. t is accepted; if t is a child of A (a *hit*) the tree is rerooted to it and runs
holding no surviving node are cancelled; else (a *miss*) every run in flight is cancelled and a
new tree starts at t. Mechanics: specpipe_levels.py (levels, roots), specpipe_kv.py (slots).
"""

from __future__ import annotations

from collections import deque

from .actions import WarmDraft
from .core import Scheduler
from .specpipe_kv import BeamSlots
from .specpipe_levels import (count_level, count_step, keep_accepted, level_job, level_run,
                              may_grow, new_tree)
from .specpipe_tree import BeamTree


class SpecPipe(Scheduler):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        o, req = self.opts, self.gen.request
        self.slots = self.pool.take()
        if self.slots is None or len(self.slots) < o.tree_width:
            raise RuntimeError("specpipe needs a partition of --tree-width sequence ids")
        self.tree = BeamTree(o.tree_width, o.tree_k)
        self.depth = max(2, min(o.max_runs, self.limits.n_stages + 1))
        self.pos_limit = min(len(req.prompt) + req.n_predict, self.limits.n_ctx) - 1
        self.kv = BeamSlots(self.slots, self.pool.graveyard, o.tree_width)
        self.job: tuple[int, list[int]] | None = None  # the job out: id, node of each row
        self.logits: dict | None = None       # node -> draft logits, known for every bottom
        self.held: deque = deque()            # results waiting for the job out
        self.stalled = False                  # no bottom has a candidate: wait for a root

    # --- hooks ---------------------------------------------------------------------------
    def on_start(self) -> None:
        self.spec.emit(WarmDraft(self.gen.request.prompt))
        super().on_start()

    def after_prefill(self) -> None:
        self._start_root()
        self._advance()

    def _result(self, result) -> None:
        if not self.prefilled or self.finished:   # the prompt's chunks; drained runs
            return super()._result(result)
        self.held.append(result)
        self._advance()

    def on_draft(self, event) -> None:
        if self.job is None or event.job_id != self.job[0]:
            return
        self.logits, self.job = dict(zip(self.job[1], event.rows)), None
        self._advance()

    def on_tick(self) -> None:
        self._advance()

    def on_finish(self) -> None:
        """Every slot emptied, after the runs in flight (drained, not cancelled: a cancel still
        travelling upstream when the shutdown passes can get a worker killed at exit)."""
        while self.held:
            self.spec.discard(self.held.popleft())
        for action in self.kv.finish():
            self.spec.emit(action)
        self.pool.give_back(self.slots)

    # --- growing: a level's draft job, then its run -----------------------------------------
    def _may_grow(self) -> bool:
        return not self.stalled and may_grow(self.tree, self.gen, self.spec, self.pos_limit)

    def _room(self) -> bool:
        return len(self.spec.live()) < self.depth and self._may_grow()

    def _advance(self) -> None:
        """One level in per result out: a level goes in once its draft logits are known and
        there is room, then a waiting result is verified; after a result the next level is
        drafted first (with no room: ahead of time). Results wait while a job is out, else a
        fast pipeline returns a root before its first level exists and nothing is speculated."""
        while self.job is None and not self.gen.done:
            if self.logits is not None and self._room():
                self._grow()
                if self.held:
                    self._absorb(self.held.popleft())
            elif self.logits is None and self._may_grow() and (self._room() or not self.held):
                self._submit()
            elif self.held:
                self._absorb(self.held.popleft())
            else:
                return

    def _submit(self) -> None:
        action, rows = level_job(self.tree, self.kv)
        self.job = (action.job.job_id, rows)
        self.spec.emit(action)

    def _grow(self) -> None:
        logits, self.logits = self.logits, None
        run, ops = level_run(self.tree, self.kv, self.slots, logits, self.gen.next_run_id)
        if run is None:   # no row named a candidate; they stay the same until a new root
            self.stalled = True
            return
        self.spec.launch(run, ops)
        count_level(self.gen.counters, self.tree, run)

    def _start_root(self) -> None:
        """A new tree rooted at the newest accepted token."""
        if len(self.spec.accepted) + 1 - self.spec.c0 > self.spec.kv_free:
            self.stop("kv-cache")
            return
        new_tree(self.tree, self.kv, self.spec, self.slots, self.limits.max_run)
        self.logits, self.stalled = None, False

    # --- results -------------------------------------------------------------------------
    def _absorb(self, result) -> None:
        run = self.spec.pop(result)
        if run.cancelled or not run.tree_ids:
            return
        tree, cnt, node = self.tree, self.gen.counters, self.tree.accepted
        if node not in run.tree_ids or result.cancelled:
            raise RuntimeError(f"run {run.run_id} does not evaluate the accepted token")
        token = result.token(run.tree_ids.index(node), self.spec.sampler)
        child = tree.child_with(node, token)
        count_step(cnt, tree, child)
        self.spec.accept([token], run.run_id)
        if self.gen.done:
            return
        if child is not None:
            self._reroot(child)
            return
        cnt.flushes += bool(tree.size or self.spec.live())  # (none if nothing was speculated)
        self.spec.cancel(self.spec.live())
        self._start_root()

    def _reroot(self, child: int) -> None:
        tree, pos = self.tree, self.tree.nodes[child].pos
        keep_accepted(tree, self.kv, self.spec, self.slots, child)
        tree.reroot(child)
        self.spec.cancel([r for r in self.spec.live() if r.max_pos > pos
                          and not any(n in tree.nodes for n in r.tree_ids)])
