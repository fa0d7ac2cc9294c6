"""SpecPipe / PipeDec: pipelined speculative decoding over a fixed-width dynamic prediction
tree (SpecPipe 3.3, PipeDec 3.3). Exact under greedy sampling, lossless under sampling.

Pipeline steps: the head keeps `depth` runs in flight, each holding one tree level (all its
nodes); whenever fewer are in flight it grows the tree by one level from the draft model and
starts that level's run. Levels therefore flow through the worker stages like a pipeline,
one level per stage. depth = the number of target stages + 1 (the extra one waits at the
first stage while the head drafts), at most --max-runs.

Growing (SpecPipe 3.3.3 "fixed-width tree", PipeDec 3.3.3): every bottom node is expanded
with its --tree-k most probable draft tokens; of these the --tree-width with the highest
cumulative draft probability form the next level.

Verifying: the result of the run holding the level of the newest accepted node A gives, in
A's row, the target's token t after A (its context is all accepted tokens, so t is exactly
the target's own next token). t is accepted. If t is a child of A (a *hit*) the tree is
rerooted to that child: every other branch is pruned, runs holding no surviving node are
cancelled (the others still compute pruned rows, which are ignored). If not (a *miss*),
the pipeline is flushed and refilled: every run in flight is cancelled and a new tree starts
with t as its root (PipeDec 3.3.4, SpecPipe 3.3.2).

Sequence ids. Target stages: sequence 0 is canonical (accepted tokens only); the tree's
`width` beam slots are the sequence ids of the one partition of width --tree-width that the
runner's PartitionPool holds for this strategy (ids 1..W), and its graveyard (W+1) receives
every dropped entry. A slot holds the context and the path from the root to its beam's
bottom node. A new tree's root is decoded in (0, slot 0); a level's node is decoded in its
own slot only; a child that branches off into another slot first gets that slot cleared
(seq_cp to the graveyard, then seq_rm) and the parent's path copied into it
(seq_cp(parent slot, slot, -1, pos)). On a hit, the accepted node's entry is copied from a
slot holding it into sequence 0, so sequence 0 always holds [0, c0) with c0 one past the
newest accepted node whose entry is still held (a node on a beam that died may have lost its
entries: a flush then decodes it again with the new root). Cells are never freed during a
generation, so every sequence's cells stay in position order and logits stay bit-exact.
Draft model (on the head): sequence 0 holds the accepted context (Drafter.sync), slot i is
draft sequence 1+i (so the draft needs width+1 sequences); its cells may be reused.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from ..backoff import IdleBackoff
from ..drafter import WARM_STEP
from ..schedule.generation import CANONICAL_SEQ
from ..transaction import DecodeTx, seq_cp, seq_rm
from .legacy import accept, prefill
from .specpipe_tree import BeamTree

log = logging.getLogger("pipeinfer.specpipe")


@dataclass
class Flight:
    run_id: int
    pos: int
    nodes: list[int]            # node id per output row (empty: no row is looked at)
    dropped: bool = False


def pipeline_depth(pipe, max_runs: int) -> int:
    """Tree levels to keep in flight: the target stages (the head's own slice counts) + 1,
    within [2, max_runs]."""
    return max(2, min(max_runs, pipe.n_stages + 1))


class SpecPipe:
    def __init__(self, pipe, gen, sampler, cfg, drafter, slots: tuple[int, ...],
                 graveyard: int):
        self.pipe, self.gen, self.sampler, self.cfg, self.drafter = (pipe, gen, sampler, cfg,
                                                                      drafter)
        opts = cfg.spec
        self.slots, self.grave = slots, graveyard
        self.tree = BeamTree(opts.tree_width, opts.tree_k)
        self.depth = pipeline_depth(pipe, opts.max_runs)
        self.cancel_enabled = opts.cancel
        self.fifo: deque[Flight] = deque()
        self.kv_free = cfg.kv_size - len(gen.request.prompt)
        self.c0 = len(gen.request.prompt)   # sequence 0 holds [0, c0)
        self.holding: set[int] = set()      # slots that may hold entries
        self.dlogits: dict = {}             # node id -> draft logits after it (not used yet)
        n_prompt = len(gen.request.prompt)
        self.pos_limit = min(n_prompt + gen.request.n_predict, cfg.n_ctx) - 1

    # --- views ---------------------------------------------------------------------------
    @property
    def accepted(self) -> list[int]:
        return list(self.gen.request.prompt) + self.gen.tokens

    def live(self) -> list[Flight]:
        return [f for f in self.fifo if not f.dropped]

    def dseq(self, slot: int) -> int:
        return 1 + slot

    # --- runs ----------------------------------------------------------------------------
    def _launch(self, positions, seqs, tokens, rows, nodes, speculative: bool) -> None:
        tx = DecodeTx(self.gen.next_run_id(), tuple(positions), tuple(seqs), tuple(rows),
                      speculative)
        self.kv_free -= len(tokens)
        self.pipe.decode(tx, list(tokens))
        self.fifo.append(Flight(tx.run_id, positions[-1], nodes))
        self.gen.counters.runs_started += 1

    def _clear(self, slot: int) -> list:
        if slot not in self.holding:
            return []
        self.holding.discard(slot)
        s = self.slots[slot]
        return [seq_cp(s, self.grave), seq_rm(s)]

    def start_root(self) -> bool:
        """A new tree rooted at the newest accepted token; decodes the accepted tokens that
        sequence 0 lacks, in (0, slot 0). False if the KV cache has no room."""
        accepted = self.accepted
        p = len(accepted) - 1
        chain = accepted[self.c0:p + 1]
        if len(chain) + 1 > self.kv_free:
            return False
        ops = [op for slot in sorted(self.holding) for op in self._clear(slot)]
        ops.append(seq_cp(CANONICAL_SEQ, self.slots[0], -1, self.c0))
        self.pipe.kv(ops)
        root = self.tree.reset(accepted[p], p)
        n_batch = self.cfg.n_batch
        for start in range(self.c0, p + 1, n_batch):
            end = min(start + n_batch, p + 1)
            n = end - start
            self._launch(range(start, end), [(CANONICAL_SEQ, self.slots[0])] * n,
                         accepted[start:end], [i == n - 1 for i in range(n)],
                         [root] if end == p + 1 else [], speculative=False)
        self.c0 = p + 1
        self.holding.add(0)
        # the draft: its sequence 0 catches up to the accepted tokens; slot 0 copies it
        self.dlogits = {root: self.drafter.sync(accepted)}
        dstage = self.drafter.stage
        dstage.seq_rm(self.dseq(0), -1, -1)
        dstage.seq_cp(0, self.dseq(0), -1, p + 1)
        self.tree.nodes[root].draft_done = True
        return True

    def can_grow(self) -> bool:
        bp = self.tree.bottom_pos()
        # Cells are not reused within a generation: speculate only while the cells left
        # still let the generation finish without it (one cell per token, +1 for a refill
        # that re-decodes a dead accepted node).
        req = self.gen.request
        left = min(req.n_predict - len(self.gen.tokens), req.n_ctx - self.gen.n_past) + 2
        return (bp is not None and len(self.live()) < self.depth and bp < self.pos_limit
                and self.kv_free >= self.tree.width + left)

    def grow(self) -> None:
        """Draft one more level and start its run."""
        tree, dstage = self.tree, self.drafter.stage
        logits = {}
        todo = [(s, b) for s, b in sorted(tree.bottom.items())
                if not tree.nodes[b].draft_done]
        if todo:
            out = dstage.decode([tree.nodes[b].pos for _, b in todo],
                                [(self.dseq(s),) for s, _ in todo],
                                tokens=[tree.nodes[b].token for _, b in todo])
            for row, (_, b) in enumerate(todo):
                logits[b] = out[row]
                tree.nodes[b].draft_done = True
        for b in tree.bottom.values():
            if b not in logits:
                logits[b] = self.dlogits.pop(b)   # the root's, from the draft's sequence 0
        parent_slot = {b: s for s, b in tree.bottom.items()}
        children = tree.choose(logits)
        ops = []
        for c in children:
            if not c.copy:
                continue
            pos = tree.nodes[c.parent].pos + 1
            src = parent_slot[c.parent]
            ops += self._clear(c.slot)
            ops.append(seq_cp(self.slots[src], self.slots[c.slot], -1, pos))
            dstage.seq_rm(self.dseq(c.slot), -1, -1)
            dstage.seq_cp(self.dseq(src), self.dseq(c.slot), -1, pos)
        self.pipe.kv(ops)
        ids = tree.grow(children)
        for c in children:
            self.holding.add(c.slot)
        pos = tree.nodes[ids[0]].pos
        n = len(ids)
        self._launch([pos] * n, [(self.slots[c.slot],) for c in children],
                     [c.token for c in children], [True] * n, ids, speculative=True)
        cnt = self.gen.counters
        cnt.runs_speculative += 1
        cnt.microbatch_tokens += n
        cnt.n_drafted += n

    # --- results -------------------------------------------------------------------------
    def absorb(self, result) -> None:
        flight = self.fifo.popleft()
        if flight.run_id != result.run_id:
            raise RuntimeError(f"result of run {result.run_id} arrived while "
                               f"{flight.run_id} was the oldest in flight")
        if flight.dropped or not flight.nodes:
            return
        tree, cnt = self.tree, self.gen.counters
        node = tree.accepted
        if node not in flight.nodes or result.cancelled:
            raise RuntimeError(f"run {flight.run_id} does not evaluate the accepted token")
        token = result.token(flight.nodes.index(node), self.sampler)
        cnt.tree_steps += 1
        cnt.tree_nodes += tree.size
        child = tree.child_with(node, token)
        if child is not None:
            cnt.tree_hits += 1
            cnt.n_accepted += 1
        accept(self.gen, [token])
        if self.gen.done:
            return
        if child is not None:
            self._reroot(child)
            return
        if tree.size or self.live():  # (not a flush when nothing was speculated)
            cnt.flushes += 1
        self._flush()

    def _reroot(self, child: int) -> None:
        tree = self.tree
        pos = tree.nodes[child].pos
        slot = tree.holder(child)
        if slot is not None and self.c0 == pos:
            self.pipe.kv([seq_cp(self.slots[slot], CANONICAL_SEQ, pos, pos + 1)])
            self.c0 = pos + 1
        d = self.drafter
        if slot is not None and tree.nodes[child].draft_done and d.n_held == pos:
            d.adopt(self.dseq(slot), tree.nodes[child].token)
        tree.reroot(child)
        doomed = [f for f in self.live() if f.pos > pos
                  and not any(n in tree.nodes for n in f.nodes)]
        self._cancel(doomed)

    def _flush(self) -> None:
        log.debug("miss at %d: flush %d run(s)", len(self.accepted) - 1, len(self.live()))
        self._cancel(self.live())
        if not self.start_root():
            self.gen.stop_reason = "kv-cache"

    def _cancel(self, flights: list[Flight]) -> None:
        for f in flights:
            f.dropped = True
        self.gen.counters.runs_cancelled_invalidated += len(flights)
        if flights and self.cancel_enabled:
            self.pipe.cancel([f.run_id for f in flights])

    def settle(self) -> None:
        """After generation: drain what is in flight (not cancelled: a cancellation still
        travelling upstream when the shutdown passes can get a worker killed at exit), and
        empty every slot."""
        self.pipe.kv([op for slot in sorted(self.holding) for op in self._clear(slot)])
        while self.fifo:
            result = self.pipe.wait()
            flight = self.fifo.popleft()
            assert flight.run_id == result.run_id
        for slot in range(self.tree.width):
            self.drafter.stage.seq_rm(self.dseq(slot), -1, -1)


def run(pipe, gen, sampler, cfg, drafter, pool, trace=None) -> None:
    """(`trace`: not written by this strategy yet; it is not on the scheduler core.)"""
    warm = lambda: drafter.prepare(gen.request.prompt, max_tokens=WARM_STEP)
    accept(gen, [prefill(pipe, gen, cfg.n_batch, idle=warm).token(-1, sampler)])
    if gen.done:
        return
    partition = pool.take()
    if partition is None or len(partition) < cfg.spec.tree_width:
        raise RuntimeError("specpipe needs a partition of --tree-width sequence ids")
    sp = SpecPipe(pipe, gen, sampler, cfg, drafter, partition, pool.graveyard)
    try:
        if not sp.start_root():
            gen.stop_reason = "kv-cache"
        backoff = IdleBackoff()
        while not gen.done:
            result = pipe.poll()
            if result is not None:  # a pipeline step: one level out, one level in
                sp.absorb(result)
                if not gen.done and sp.can_grow():
                    sp.grow()
                backoff.reset()
                continue
            if sp.can_grow():
                sp.grow()
                backoff.reset()
                continue
            backoff.wait()
        sp.settle()
    finally:
        pool.give_back(partition)
