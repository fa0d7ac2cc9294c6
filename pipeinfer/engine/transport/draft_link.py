"""The link of PipeSpec's draft models on ranks of their own (hierarchy_remote.py) and the head:
int64 arrays [kind, arg, tokens...] on one tag, so that the messages of one sender arrive in
the order sent. Built on mpi.Link (mpi.py alone imports mpi4py)."""

from __future__ import annotations

import numpy as np

from .wire import Tag
from .mpi import HEAD, Link


class DraftLink(Link):
    """Messages of PipeSpec's draft models on ranks of their own (hierarchy_remote.py), between
    those ranks and the head: int64 arrays [kind, arg, tokens...] on one tag, so that the
    messages of one sender arrive in the order sent."""

    def send_draft(self, dest: int, kind: int, arg: int, tokens) -> None:
        buf = np.empty(2 + len(tokens), dtype=np.int64)
        buf[0], buf[1], buf[2:] = kind, arg, tokens
        self.isend(buf, dest, Tag.DRAFT)

    def poll_draft(self) -> tuple[int, int, int, list[int]] | None:
        """The next waiting message as (source, kind, arg, tokens), or None."""
        status = self.probe(None, Tag.DRAFT)
        if status is None:
            return None
        source = status.Get_source()
        buf = self.recv_array(source, Tag.DRAFT, np.int64)
        return source, int(buf[0]), int(buf[1]), buf[2:].tolist()

    def send_stats(self, stats: dict) -> None:
        self.isend_obj(stats, HEAD, Tag.STATS)

    def poll_stats(self, source: int) -> dict | None:
        if self.probe(source, Tag.STATS) is None:
            return None
        return self.comm.recv(source=source, tag=int(Tag.STATS))
