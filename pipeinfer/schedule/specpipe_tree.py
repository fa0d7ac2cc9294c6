"""The fixed-width dynamic prediction tree of the `specpipe` strategy (SpecPipe 3.2/3.3.3,
PipeDec 3.3), with its beam slots.

The tree is kept rooted at the newest accepted token (the *accepted* node). Every node is at
one position; the nodes at one position form a *level*, and each level is evaluated by one
target run. A *beam slot* (index 0..width-1) follows one path from the root down to a node of
the deepest level, its *bottom*; the slot's KV sequences (target and draft) hold the context
and that path. A node is *live* while some slot's bottom descends from it (or is it): only
then are its KV entries still held by a slot. Nodes whose beam was not extended stay in the
tree (they may still be hit) but are *dead*: their slot was handed to another beam.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tree_draft import SparseLogits

# A candidate less likely than this (e^-40) is none: a row that gives no token such odds (an
# n-gram row that matched nothing, or nothing beyond its few matches) adds no child there, so
# a level may be narrower than the width, or not exist.
NEGLIGIBLE_LOGP = -40.0


@dataclass
class TreeNode:
    token: int
    pos: int
    parent: int                 # node id, -1 for the root
    logp: float                 # cumulative draft log-probability below the root
    children: list[int] = field(default_factory=list)
    draft_done: bool = False    # the draft evaluated it (in its slot's draft sequence)
    origin: str = "model"       # the draft row it was chosen from: "model" or "ngram"


@dataclass(frozen=True)
class Child:
    """A node chosen for the next level: its parent, token, slot, and whether the slot must
    first receive a copy of the parent's path (a branch off another beam)."""
    parent: int
    token: int
    logp: float
    slot: int
    copy: bool
    origin: str = "model"       # the source of the row it was chosen from


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def ranked(row, k: int) -> list[tuple[int, float]]:
    """A draft row's (logits over the vocabulary, or a SparseLogits) k likeliest tokens with
    their log-probabilities, best first, without those of negligible probability."""
    if isinstance(row, SparseLogits):
        if not row.tokens:
            return []
        lp = log_softmax(np.asarray(row.logits)).tolist()
        # (a stable sort: equally likely tokens keep the row's order)
        pairs = sorted(zip(row.tokens, lp), key=lambda c: -c[1])[:k]
    else:
        lp = log_softmax(row)
        k = min(k, lp.size)
        top = np.argpartition(-lp, k - 1)[:k]
        pairs = sorted(((int(t), float(lp[t])) for t in top), key=lambda c: (-c[1], c[0]))
    return [(int(t), float(p)) for t, p in pairs if p >= NEGLIGIBLE_LOGP]


class BeamTree:
    def __init__(self, width: int, k: int):
        if width < 1 or k < 1:
            raise ValueError("tree width and k must be at least 1")
        self.width, self.k = width, k
        self.nodes: dict[int, TreeNode] = {}
        self.bottom: dict[int, int] = {}    # slot -> node id of its beam's bottom
        self.accepted = -1
        self._ids = 0

    # --- structure -----------------------------------------------------------------------
    def reset(self, token: int, pos: int) -> int:
        """A new tree: its root (the accepted token at `pos`) is the bottom of slot 0."""
        self.nodes.clear()
        root = self._add(TreeNode(token, pos, -1, 0.0))
        self.bottom = {0: root}
        self.accepted = root
        return root

    def _add(self, node: TreeNode) -> int:
        nid, self._ids = self._ids, self._ids + 1
        self.nodes[nid] = node
        if node.parent >= 0:
            self.nodes[node.parent].children.append(nid)
        return nid

    def descends(self, node: int, ancestor: int) -> bool:
        while node >= 0:
            if node == ancestor:
                return True
            node = self.nodes[node].parent
        return False

    def holder(self, node: int) -> int | None:
        """A slot whose sequences hold `node`'s entries (None: the node is dead)."""
        return next((s for s, b in sorted(self.bottom.items()) if self.descends(b, node)), None)

    def child_with(self, node: int, token: int) -> int | None:
        return next((c for c in self.nodes[node].children if self.nodes[c].token == token),
                    None)

    @property
    def size(self) -> int:
        """Speculative nodes below the accepted one."""
        return len(self.nodes) - 1

    def bottom_pos(self) -> int | None:
        return self.nodes[next(iter(self.bottom.values()))].pos if self.bottom else None

    def reroot(self, child: int) -> list[int]:
        """Keep only the subtree of `child` (now the accepted node); returns the slots whose
        beams left the tree."""
        keep = {n for n in self.nodes if self.descends(n, child)}
        freed = [s for s, b in self.bottom.items() if b not in keep]
        for s in freed:
            del self.bottom[s]
        self.nodes = {n: v for n, v in self.nodes.items() if n in keep}
        self.nodes[child].parent = -1
        self.accepted = child
        return freed

    # --- growing -------------------------------------------------------------------------
    def choose(self, logits: dict[int, np.ndarray]) -> list[Child]:
        """The next level (SpecPipe 3.3.3): each bottom node's top-k draft candidates, of
        which the `width` with the highest cumulative probability survive (fewer, or none,
        when the rows name fewer tokens of more than negligible probability). A parent's
        first surviving child keeps the parent's slot; further children take slots of beams
        that died or free slots. Children come grouped by parent, in slot order."""
        cands = []
        beams = sorted(self.bottom.items())
        for order, (slot, node) in enumerate(beams):
            row = logits[node]
            origin = getattr(row, "origin", "model")
            for rank, (t, lp) in enumerate(ranked(row, self.k)):
                cands.append((self.nodes[node].logp + lp, order, rank, slot, node, t, origin))
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        chosen = sorted(cands[:self.width], key=lambda c: (c[1], c[2]))
        parents = {c[3] for c in chosen}
        free = [s for s in range(self.width) if s not in parents]
        out, used = [], set()
        for logp, _, _, slot, node, token, origin in chosen:
            if slot not in used:
                used.add(slot)
                out.append(Child(node, token, logp, slot, False, origin))
            else:
                out.append(Child(node, token, logp, free.pop(0), True, origin))
        return out

    def grow(self, children: list[Child]) -> list[int]:
        """Add the chosen level; the bottoms move down to it. Returns the new node ids."""
        ids = []
        for c in children:
            p = self.nodes[c.parent]
            ids.append(self._add(TreeNode(c.token, p.pos + 1, c.parent, c.logp,
                                          origin=c.origin)))
        self.bottom = {c.slot: nid for c, nid in zip(children, ids)}
        return ids
