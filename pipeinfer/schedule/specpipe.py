"""SpecPipe / PipeDec: pipelined speculative decoding over a fixed-width dynamic prediction
tree (SpecPipe 3.3, PipeDec 3.3). Exact under greedy sampling, lossless under sampling.

The schedule. `depth` runs stay in flight (the target stages + 1, the extra one waiting at
the first stage while the head drafts; at most --max-runs), each holding one tree level: a
level's run starts whenever fewer are in flight. Growing a level: every bottom node's
--tree-k likeliest draft tokens, of which the --tree-width with the highest cumulative draft
probability survive (SpecPipe 3.3.3). The draft evaluates a level's nodes in one job
(tree_draft.py) once the level is out, also when the pipeline is full: the next level is
ready when a result makes room. Results wait while a job is out (see _advance).
The run holding the newest accepted node A gives, in A's row, the target's next token t (its
context is all accepted tokens). t is accepted; if t is a child of A (a *hit*) the tree is
rerooted to it and runs holding no surviving node are cancelled (others compute pruned rows,
ignored); else (a *miss*) every run in flight is cancelled and a new tree starts at t.

KV sequences (slots, copies, the draft's mirror of them): specpipe_kv.py. On a hit the
accepted node's entry moves into sequence 0 if a slot still holds it (else the next root
decodes it again).
"""

from __future__ import annotations

from collections import deque

from ..transaction import seq_cp
from .actions import CancelRuns, KvOps, WarmDraft
from .core import Scheduler
from .generation import CANONICAL_SEQ
from .runs import Node, Run
from .specpipe_kv import BeamSlots
from .specpipe_tree import BeamTree
from .tree_draft import StartTreeDraft


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
        # (results wait while a job is out: the tree has not changed since it went out)
        self.logits, self.job = dict(zip(self.job[1], event.rows)), None
        self._advance()

    def on_tick(self) -> None:
        self._advance()

    def on_finish(self) -> None:
        """Empty every slot (runs in flight are drained, not cancelled: a cancellation still
        travelling upstream when the shutdown passes can get a worker killed at exit). Every
        stage clears the slots after the runs sent before, so they are free for what follows."""
        while self.held:
            self.spec.discard(self.held.popleft())
        ops = self.kv.clear_all()
        if ops:
            self.spec.emit(KvOps(tuple(ops)))
        if (job := self.kv.final_job()) is not None:
            self.spec.emit(StartTreeDraft(job))
        self.pool.give_back(self.slots)

    # --- growing -------------------------------------------------------------------------
    def _may_grow(self) -> bool:
        bp = self.tree.bottom_pos()
        # Cells are not reused within a generation: speculate only while the cells left
        # still let the generation finish without it (one cell per token, +1 for a refill
        # that re-decodes a dead accepted node).
        req, gen = self.gen.request, self.gen
        left = min(req.n_predict - len(gen.tokens), req.n_ctx - gen.n_past) + 2
        return (bp is not None and bp < self.pos_limit
                and self.spec.kv_free >= self.tree.width + left)

    def _room(self) -> bool:
        return len(self.spec.live()) < self.depth and self._may_grow()

    def _advance(self) -> None:
        """One level in per result out, as a loop with a synchronous draft would do it: a
        level goes in once its draft logits are known and there is room, and a result
        waiting is verified right after it; after a result, the next level is drafted first
        if there is room. Results wait while a job is out: else a fast pipeline returns a
        root's result before the root's first level exists, and nothing is speculated. With
        no room, the draft evaluates the newest level ahead of time."""
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
        tree = self.tree
        todo = [(s, b) for s, b in sorted(tree.bottom.items()) if not tree.nodes[b].draft_done]
        for _, b in todo:
            tree.nodes[b].draft_done = True
        job, root = self.kv.job(tuple((self.kv.dseq(s), tree.nodes[b].pos,
                                       tree.nodes[b].token) for s, b in todo))
        self.job = (job.job_id, [b for _, b in todo] + ([root] if root is not None else []))
        self.spec.emit(StartTreeDraft(job))

    def _grow(self) -> None:
        tree, logits, self.logits = self.tree, self.logits, None
        parent_slot = {b: s for s, b in tree.bottom.items()}
        children = tree.choose(logits)
        ops = [op for c in children if c.copy
               for op in self.kv.branch(parent_slot[c.parent], c.slot,
                                        tree.nodes[c.parent].pos + 1)]
        ids = tree.grow(children)
        self.kv.holding.update(c.slot for c in children)
        nodes = [Node(c.token, -1, 0, (self.slots[c.slot],)) for c in children]
        # (no single context: the tree holds each row's path)
        self.spec.launch(Run(self.gen.next_run_id(), tree.nodes[ids[0]].pos, (), nodes,
                             speculative=True, tree_ids=tuple(ids)), ops)
        cnt = self.gen.counters
        cnt.runs_speculative += 1
        cnt.microbatch_tokens += len(ids)
        cnt.n_drafted += len(ids)

    def _start_root(self) -> None:
        """A new tree rooted at the newest accepted token, after decoding the accepted tokens
        sequence 0 lacks in (0, slot 0)."""
        spec, accepted = self.spec, self.spec.accepted
        p, c0 = len(accepted) - 1, self.spec.c0
        if p + 2 - c0 > spec.kv_free:
            self.stop("kv-cache")
            return
        root = self.tree.reset(accepted[p], p)
        ops = self.kv.new_root(c0, root, tuple(accepted))
        # its last row evaluates the root
        spec.chain(accepted, c0, p + 1, (CANONICAL_SEQ, self.slots[0]), self.limits.n_batch,
                   ops, (root,))
        spec.c0 = p + 1
        self.tree.nodes[root].draft_done = True   # its logits are the sync's
        self.logits = None

    # --- results -------------------------------------------------------------------------
    def _absorb(self, result) -> None:
        run = self.spec.pop(result)
        if run.cancelled or not run.tree_ids:
            return
        tree, cnt = self.tree, self.gen.counters
        node = tree.accepted
        if node not in run.tree_ids or result.cancelled:
            raise RuntimeError(f"run {run.run_id} does not evaluate the accepted token")
        token = result.token(run.tree_ids.index(node), self.spec.sampler)
        cnt.tree_steps += 1
        cnt.tree_nodes += tree.size
        child = tree.child_with(node, token)
        cnt.tree_hits += child is not None
        cnt.n_accepted += child is not None
        self.spec.accept([token], run.run_id)
        if self.gen.done:
            return
        if child is not None:
            self._reroot(child)
            return
        if tree.size or self.spec.live():   # (not a flush when nothing was speculated)
            cnt.flushes += 1
        self._cancel(self.spec.live())
        self._start_root()

    def _reroot(self, child: int) -> None:
        tree = self.tree
        pos, slot = tree.nodes[child].pos, tree.holder(child)
        if slot is not None and self.spec.c0 == pos:
            self.spec.emit(KvOps((seq_cp(self.slots[slot], CANONICAL_SEQ, pos, pos + 1),)))
            self.spec.c0 = pos + 1
        if slot is not None and tree.nodes[child].draft_done:
            self.kv.adopt(slot, tree.nodes[child].token, pos)
        tree.reroot(child)
        self._cancel([r for r in self.spec.live() if r.max_pos > pos
                      and not any(n in tree.nodes for n in r.tree_ids)])

    def _cancel(self, runs: list[Run]) -> None:
        for run in runs:
            run.cancelled = True
        self.gen.counters.runs_cancelled_invalidated += len(runs)
        if runs and self.spec.cancel_enabled:
            self.spec.emit(CancelRuns(tuple(r.run_id for r in runs)))
