"""Runs of the target pipeline as the head tracks them (paper IV-A-1, IV-D).

A run evaluates a token tree that continues a context (the tokens at positions [0, base)).
Tree nodes are listed parents-first; a node at depth d sits at position base + d, and belongs
to the sequence ids of every branch through it. A non-speculative run is the one-node tree
holding the newest accepted token, in the canonical sequence.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Sequence

from .transaction import DecodeTx


class RunState(enum.Enum):
    VALID = "valid"                # may still decide new tokens
    SUPERFLUOUS = "superfluous"    # every position it could decide is already accepted
    INVALIDATED = "invalidated"    # it assumed tokens that were rejected


@dataclass(frozen=True)
class Node:
    token: int
    parent: int        # index of the parent node, -1 for a root
    depth: int
    seqs: tuple[int, ...]


@dataclass
class Run:
    run_id: int
    base: int
    context: tuple[int, ...]          # tokens assumed at positions [0, base)
    nodes: list[Node]
    speculative: bool
    partition: tuple[int, ...] | None = None
    cancelled: bool = False
    main_path: list[int] = field(default_factory=list)  # node indices of branch 0
    guesses: int = 0          # nodes that are the draft's guesses (not a known token)
    n_accepted: int = 0       # of its guesses, accepted (the guard reads it when it leaves)
    root_credited: bool = False  # its root guess was counted as accepted (see Speculation)
    prefill: bool = False     # a chunk of the prompt (specpipe: of accepted tokens): only its
                              # last row (if any) is output
    final_chunk: bool = False  # prefill: the prompt's last chunk, whose last row gives a token
    tree_ids: tuple[int, ...] = ()  # specpipe: the BeamTree node of each output row
    origin: str = "model"     # where its draft came from: "model" or "ngram" (counters)

    @property
    def max_pos(self) -> int:
        return self.base + max(n.depth for n in self.nodes)

    def pos(self, node: int) -> int:
        return self.base + self.nodes[node].depth

    def children(self, node: int) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.parent == node]

    def tx(self) -> DecodeTx:
        n = len(self.nodes)
        rows = (tuple(self.final_chunk and i == n - 1 for i in range(n)) if self.prefill
                else (True,) * n)
        return DecodeTx(self.run_id, tuple(self.base + node.depth for node in self.nodes),
                        tuple(node.seqs for node in self.nodes), rows, self.speculative)

    def tokens(self) -> list[int]:
        return [n.token for n in self.nodes]

    def path_to(self, accepted: Sequence[int]) -> int | None:
        """The node at the newest accepted position reached by following `accepted` tokens
        from a root, or None if the accepted tokens leave the tree (or do not reach it)."""
        node, p = -1, self.base
        while p < len(accepted):
            nxt = [c for c in self.children(node) if self.nodes[c].token == accepted[p]]
            if not nxt:
                return None
            node, p = nxt[0], p + 1
        return node if node >= 0 else None

    def continues_rejected(self, accepted: Sequence[int]) -> bool:
        """Whether its context holds a token the target rejected: it continued another run's
        wrong guess, so its own guesses were never judged."""
        overlap = min(self.base, len(accepted))
        return tuple(accepted[:overlap]) != self.context[:overlap]

    def classify(self, accepted: Sequence[int]) -> RunState:
        """Compare with the accepted tokens (prompt + generated; the last one is pending)."""
        n = len(accepted)
        if self.continues_rejected(accepted):
            return RunState.INVALIDATED
        if n <= self.base:
            return RunState.VALID  # ahead of the accepted tokens; consistent so far
        if self.max_pos < n - 1:
            return RunState.SUPERFLUOUS
        return RunState.VALID if self.path_to(accepted) is not None else RunState.INVALIDATED

    def describe(self) -> str:
        kind = "spec" if self.speculative else "prefill" if self.prefill else "main"
        return (f"run {self.run_id} ({kind}) pos {self.base}..{self.max_pos} "
                f"{len(self.nodes)} token(s) seqs {self.partition or (0,)}")


def tree_from_branches(branches: Sequence[Sequence[int]], seqs: Sequence[int]) -> tuple[
        list[Node], list[int]]:
    """Merge branches (token lists sharing prefixes) into tree nodes, parents first (by depth).
    Branch b uses sequence id seqs[b]. Returns (nodes, node indices of branch 0)."""
    index: dict[tuple[int, ...], int] = {}
    members: dict[tuple[int, ...], list[int]] = {}
    for b, branch in enumerate(branches):
        for d in range(len(branch)):
            members.setdefault(tuple(branch[:d + 1]), []).append(seqs[b])
    order = sorted(members, key=len)  # stable: parents before children, branch order kept
    nodes: list[Node] = []
    for prefix in order:
        index[prefix] = len(nodes)
        parent = index[prefix[:-1]] if len(prefix) > 1 else -1
        nodes.append(Node(prefix[-1], parent, len(prefix) - 1, tuple(members[prefix])))
    main = [index[tuple(branches[0][:d + 1])] for d in range(len(branches[0]))] if branches else []
    return nodes, main


def trim_branches(branches: Sequence[Sequence[int]], max_nodes: int) -> list[list[int]]:
    """The draft tree cut to at most `max_nodes` distinct nodes (KV cells): branches are kept
    in order (branch 0, the greedy path, first), the first that does not fit is shortened,
    and branches adding no node of their own are dropped."""
    seen: set[tuple[int, ...]] = set()
    kept: list[list[int]] = []
    for branch in branches:
        cut, added = [], False
        for d in range(len(branch)):
            prefix = tuple(branch[:d + 1])
            if prefix not in seen:
                if len(seen) >= max_nodes:
                    break
                seen.add(prefix)
                added = True
            cut.append(branch[d])
        if added:
            kept.append(cut)
    return kept
