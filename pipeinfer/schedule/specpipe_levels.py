"""How SpecPipe's tree gains a level (the mechanics under specpipe.py's schedule): the draft job
that evaluates the bottom nodes' tokens in their slots, and the run that puts the chosen
children into the pipeline, with the KV copies that branch a slot off another beam."""

from __future__ import annotations

from typing import Callable

from .actions import KvOps
from .generation import CANONICAL_SEQ
from .runs import Node, Run
from .specpipe_kv import BeamSlots
from .specpipe_tree import BeamTree
from .speculation import runs_of
from .transaction import seq_cp
from .tree_draft import StartTreeDraft


def level_job(tree: BeamTree, kv: BeamSlots) -> tuple[StartTreeDraft, list[int]]:
    """The job drafting after every bottom node not drafted yet, and the node of each of its
    rows (the last one a re-decoded dead root, if the slots need it)."""
    todo = [(s, b) for s, b in sorted(tree.bottom.items()) if not tree.nodes[b].draft_done]
    for _, b in todo:
        tree.nodes[b].draft_done = True
    job, root = kv.job(tuple((kv.dseq(s), tree.nodes[b].pos, tree.nodes[b].token)
                             for s, b in todo))
    return StartTreeDraft(job), [b for _, b in todo] + ([root] if root is not None else [])


def level_run(tree: BeamTree, kv: BeamSlots, slots: tuple[int, ...], logits: dict,
              next_id: Callable[[], int]) -> tuple[Run | None, list]:
    """The run of the next level (the children `tree.choose` keeps, given the draft logits of
    the bottom nodes) and the KV ops it needs first; no run if no row named a candidate (the
    tree stays as it is)."""
    parent_slot = {b: s for s, b in tree.bottom.items()}
    children = tree.choose(logits)
    if not children:
        return None, []
    ops = [op for c in children if c.copy
           for op in kv.branch(parent_slot[c.parent], c.slot, tree.nodes[c.parent].pos + 1)]
    ids = tree.grow(children)
    kv.holding.update(c.slot for c in children)
    nodes = [Node(c.token, -1, 0, (slots[c.slot],)) for c in children]
    # (no single context: the tree holds each row's path)
    return Run(next_id(), tree.nodes[ids[0]].pos, (), nodes, speculative=True,
               tree_ids=tuple(ids)), ops


def may_grow(tree: BeamTree, gen, spec, pos_limit: int) -> bool:
    """Whether the tree may gain a level. Cells are not reused within a generation: speculate
    only while the cells left still let the generation finish without it (one cell per
    token, +1 for a refill that re-decodes a dead accepted node)."""
    bp = tree.bottom_pos()
    req = gen.request
    left = min(req.n_predict - len(gen.tokens), req.n_ctx - gen.n_past) + 2
    return bp is not None and bp < pos_limit and spec.kv_free >= tree.width + left


def count_level(counters, tree: BeamTree, run: Run) -> None:
    """A level's run went out: its nodes are drafted tokens (some, maybe, n-gram drafts)."""
    n_nodes = len(run.nodes)
    counters.runs_speculative += 1
    counters.microbatch_tokens += n_nodes
    counters.n_drafted += n_nodes
    counters.n_drafted_ngram += sum(tree.nodes[n].origin == "ngram" for n in run.tree_ids)


def count_step(counters, tree: BeamTree, child: int | None) -> None:
    """A target token verified against the tree: a hit when the tree holds it (`child`)."""
    hit = child is not None
    counters.tree_steps += 1
    counters.tree_nodes += tree.size
    counters.tree_hits += hit
    counters.n_accepted += hit
    counters.n_accepted_ngram += hit and tree.nodes[child].origin == "ngram"


def new_tree(tree: BeamTree, kv: BeamSlots, spec, slots: tuple[int, ...], max_run: int) -> None:
    """A tree rooted at the newest accepted token: the accepted tokens sequence 0 lacks are
    decoded in (0, slot 0) in runs of at most max_run, the last row evaluating the root (whose
    draft logits come with the next job's sync)."""
    accepted, c0 = spec.accepted, spec.c0
    p = len(accepted) - 1
    root = tree.reset(accepted[p], p)
    ops = kv.new_root(c0, root, tuple(accepted))
    spec.chain(accepted, runs_of(range(c0, p + 1), max_run), (CANONICAL_SEQ, slots[0]), ops,
               (root,))
    spec.c0 = p + 1
    tree.nodes[root].draft_done = True


def keep_accepted(tree: BeamTree, kv: BeamSlots, spec, slots: tuple[int, ...], child: int) -> None:
    """An accepted tree node's KV entry moves into sequence 0 if a slot still holds it (else
    the next root decodes it again), and into the draft's sequence 0 if the draft has it."""
    pos, slot = tree.nodes[child].pos, tree.holder(child)
    if slot is None:
        return
    if spec.c0 == pos:
        spec.emit(KvOps((seq_cp(slots[slot], CANONICAL_SEQ, pos, pos + 1),)))
        spec.c0 = pos + 1
    if tree.nodes[child].draft_done:
        kv.adopt(slot, tree.nodes[child].token, pos)
