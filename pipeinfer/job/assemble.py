"""A rank's copy of a request's KV cells for the stage it holds now, from the copies on its
host: its own, of this very stage; or, when the split changed after a host was lost
(job/takeover.py), one put together layer by layer (model/kv_state.py) from the copy it kept
of its last stage and the copies its neighbours sent of theirs (engine/worker/replicas.py).

A copy counts only if it is of these very layers computed alike (its identity: the model,
the layers, the settings and build that make the cells, `stamp`); the pieces are cut to the
positions all of them hold, so the whole is what one stage of these layers would have
kept."""

from __future__ import annotations

from ..model import kv_state
from ..model.kept_cells import Kept, KeptCells, identity_of
from ..model.kept_writer import Writer


class StageCopies:
    """The copies a rank of `layers` [first, last) can use: `own` (its store, of this stage)
    and `held` (those its neighbours sent), valid when of identity_of(*stamp, first, last)."""

    def __init__(self, own: KeptCells, held: KeptCells | None, stamp: tuple):
        self.own, self.held, self.stamp = own, held, tuple(stamp)

    @property
    def layers(self) -> tuple[int, int]:
        return self.own.layers

    def in_background(self) -> None:
        """From now on both stores write on a thread of their own (model/kept_writer.py):
        once the copies were taken back, while the job runs."""
        self.own.writer = Writer()
        if self.held is not None:
            self.held.writer = self.own.writer

    def copy_of(self, key: int) -> tuple[Kept | None, str]:
        """Request `key`'s cells for this stage, or None and why there are none."""
        copy, why = self.own.read(key)
        if copy is not None or why != "no copy" or self.layers == (0, 0):
            return copy, why
        pieces, why = self._pieces(key)
        if not pieces:
            return None, why
        return self._joined(key, pieces)

    def _pieces(self, key: int) -> tuple[list[tuple[Kept, int, int]], str]:
        """(copy, from, to) covering this stage's layers, own copies first."""
        found = self.own.copies_of(key) + (self.held.copies_of(key) if self.held else [])
        valid = [c for c in found if c.layers[1] > c.layers[0]
                 and c.identity == identity_of(*self.stamp, *c.layers)]
        pieces, at, last = [], self.layers[0], self.layers[1]
        while at < last:
            copy = next((c for c in valid if c.layers[0] <= at < c.layers[1]), None)
            if copy is None:
                return [], f"no copy of layer {at}" if found else "no copy"
            end = min(copy.layers[1], last)
            pieces.append((copy, at, end))
            at = end
        return pieces, ""

    def _joined(self, key: int, pieces) -> tuple[Kept | None, str]:
        least = min(pieces, key=lambda p: p[0].n)[0]
        states = []
        for copy, lo, hi in pieces:
            state = kv_state.parse(copy.body)
            if state is None:
                return None, "a copy not laid out as this build writes cells"
            if state.n_layer != copy.layers[1] - copy.layers[0]:
                return None, "a copy of other layers than it says"
            first = copy.layers[0]
            states.append(state.first(least.n).sliced(lo - first, hi - first))
        whole = kv_state.join(states)
        if whole is None:
            return None, "copies of other cells"
        copy = Kept(key, least.n, least.digest, 0, (), whole.to_bytes(), self.own.identity,
                    self.layers)
        self.own.write(copy)   # (this stage's own from now on)
        return copy, ""
