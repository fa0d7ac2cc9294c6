"""PipeSpec's draft models on ranks of their own (PipeSpec Algorithm 1 with one model per
node): `--layer-split 0,0.5,0.5/1/1` puts M0 on rank 3 and M1 on rank 4, after the target's
ranks. Every draft rank runs its model continuously, never waiting for the others:

- M0 drafts greedily while its buffer is shorter than the head's horizon;
- Mi (i > 0) verifies, in one batch, up to `window` tokens of M(i-1)'s newest buffer beyond
  its own, and appends the ones it agrees with plus its own next token (hierarchy.Level);
- whenever its buffer changes, a rank sends the whole buffer on (BUFFER) to the next model
  (M(k-1): to the head, whose target pipeline verifies it);
- when the previous model's buffer does not extend its own (a rejection, a bonus token, or a
  stale message), Mi sends its buffer back (ROLLBACK) to every earlier model, which makes its
  own buffer extend it (hierarchy.merge) and trims its KV to match;
- the head sends the target's accepted tokens with the horizon (SYNC) to every draft rank
  after each verification; they merge them the same way.

Whole buffers travel (a few hundred int64s at most) so no message depends on an earlier one
having arrived: a stale buffer is recognised by not extending the receiver's own and ignored,
and proposals are only guesses that the target verifies, so the output never depends on the
timing. End: the head sends STOP with the final tokens; each draft rank trims its KV to them,
sends its statistics, then END to every other draft rank and the head, and leaves once every
other draft rank's END has arrived (nothing is left in flight to a rank that is gone).
"""

from __future__ import annotations

from typing import Protocol, Sequence

from ..transport.backoff import Backoff, IdleBackoff
from .hierarchy import Level
from ...schedule.buffers import extends, merge

SYNC, BUFFER, ROLLBACK, STOP, END = range(5)
HEAD = 0


class DraftChannel(Protocol):
    """What the draft ranks and the head need from the messaging layer (mpi_transport's
    DraftLink)."""

    def send_draft(self, dest: int, kind: int, arg: int, tokens) -> None: ...
    def poll_draft(self) -> tuple[int, int, int, list[int]] | None: ...
    def send_stats(self, stats: dict) -> None: ...
    def poll_stats(self, source: int) -> dict | None: ...
    def check_errors(self) -> None: ...
    def flush(self, timeout: float = 30.0) -> bool: ...


class RemoteHierarchy:
    """The head's side: what hierarchy_drafts.py needs of a Hierarchy, for draft models
    on the ranks `ranks` (M0 first)."""

    def __init__(self, link: DraftChannel, ranks: Sequence[int], ahead: int, limit: int):
        self.link, self.ranks = link, list(ranks)
        self.ahead, self.limit = ahead, limit  # M0 drafts up to accepted + ahead (<= limit)
        self.accepted: list[int] = []
        self.top: list[int] = []                # M(k-1)'s newest buffer
        self.horizon = 0
        self._rows: list[dict] = []

    def reset(self, tokens: Sequence[int]) -> None:
        self.accepted, self.top = list(tokens), list(tokens)
        self._send_sync(min(len(tokens) + self.ahead, self.limit))

    def warm(self, tokens: Sequence[int], max_tokens: int) -> None:
        self._receive()  # the draft ranks warm up on their own once they have the prompt

    def sync(self, accepted: Sequence[int]) -> None:
        accepted = list(accepted)
        if accepted == self.accepted:
            return
        self.accepted = accepted
        self.top = merge(self.top, accepted)
        self._send_sync(min(len(accepted) + self.ahead, self.limit))

    def step(self, horizon: int) -> bool:
        """Take in what the draft ranks sent; True when the last draft model's buffer changed."""
        if horizon != self.horizon:
            self._send_sync(horizon)
        return self._receive()

    @property
    def buffer(self) -> list[int]:
        """M(k-1)'s newest buffer, as the last draft rank sent it."""
        return self.top

    def finish(self, accepted: Sequence[int]) -> None:
        """Stop every draft rank (their KV is trimmed to `accepted`) and collect statistics."""
        for rank in self.ranks:
            self.link.send_draft(rank, STOP, 0, list(accepted))
        rows: dict[int, dict] = {}
        ended: set[int] = set()
        backoff = Backoff()
        while len(rows) < len(self.ranks) or len(ended) < len(self.ranks):
            self.link.check_errors()
            message = self.link.poll_draft()
            if message is not None:
                if message[1] == END:
                    ended.add(message[0])
                continue
            for rank in self.ranks:
                if rank not in rows and (row := self.link.poll_stats(rank)) is not None:
                    rows[rank] = row
            backoff.wait()
        self._rows = [rows[rank] for rank in self.ranks]

    def rows(self) -> list[dict]:
        return self._rows

    def _send_sync(self, horizon: int) -> None:
        self.horizon = horizon
        for rank in self.ranks:
            self.link.send_draft(rank, SYNC, horizon, self.accepted)

    def _receive(self) -> bool:
        changed = False
        while (message := self.link.poll_draft()) is not None:
            source, kind, _arg, tokens = message
            if kind == BUFFER and source == self.ranks[-1] and tokens != self.top:
                self.top, changed = tokens, True
        return changed


class DraftRank:
    """A draft rank's loop: model M`index` of the hierarchy on ranks `ranks` (M0 first)."""

    def __init__(self, link: DraftChannel, level: Level, index: int, ranks: Sequence[int],
                 window: int):
        self.link, self.level, self.index = link, level, index
        self.ranks, self.window = list(ranks), window
        self.down = self.ranks[index + 1] if index + 1 < len(self.ranks) else HEAD
        self.lower: list[int] | None = None   # M(index-1)'s newest buffer
        self.horizon = 0
        self.started = False
        self._sent_down: list[int] | None = None
        self._sent_up: list[int] | None = None
        self.ended: set[int] = set()  # draft ranks whose END came (before or after our STOP)

    def run(self) -> dict:
        backoff = IdleBackoff()
        while True:
            final = self._receive()
            if final is not None:
                return self._stop(final)
            if not self.started:
                backoff.wait()
                continue
            worked = self._work()
            self._publish()
            if worked:
                backoff.reset()
            else:
                backoff.wait()

    def _receive(self) -> list[int] | None:
        """Apply every waiting message; the final tokens if STOP came."""
        while (message := self.link.poll_draft()) is not None:
            source, kind, arg, tokens = message
            if kind == STOP:
                return tokens
            if kind == SYNC:
                self.horizon = arg
                if not self.started:
                    self.level.reset(tokens)
                    self.started = True
                else:
                    self.level.merge(tokens)
            elif kind == ROLLBACK and self.started:
                self.level.merge(tokens)
            elif kind == BUFFER:
                self.lower = tokens
            elif kind == END:  # from a rank that had its STOP first: _stop counts it
                self.ended.add(source)
        return None

    def _work(self) -> bool:
        out = self.level.out
        if self.index == 0:
            if len(out) < self.horizon:
                self.level.draft()
                return True
            return False
        lower, n = self.lower, len(out)
        if lower is None or len(lower) <= n or not extends(lower, out):
            return False
        self.level.verify(lower[n:n + self.window])
        return True

    def _publish(self) -> None:
        out = self.level.out
        if out != self._sent_down:
            self._sent_down = list(out)
            self.link.send_draft(self.down, BUFFER, 0, out)
        if self.index and self.lower is not None and not extends(self.lower, out) \
                and out != self._sent_up:
            self._sent_up = list(out)
            for rank in self.ranks[:self.index]:
                self.link.send_draft(rank, ROLLBACK, 0, out)

    def _stop(self, final: list[int]) -> dict:
        self.level.set_out(list(final), rollback=False)  # no KV entries beyond the final tokens
        row = self.level.stats.row()
        row["kv_end"] = self.level.stage.seq_pos_max(0) + 1
        self.link.send_stats(row)
        others = [r for r in self.ranks if r != self.ranks[self.index]]
        for rank in others + [HEAD]:
            self.link.send_draft(rank, END, 0, [])
        backoff = Backoff()
        while len(self.ended) < len(others):
            message = self.link.poll_draft()
            if message is None:
                backoff.wait()
            elif message[1] == END:
                self.ended.add(message[0])
        self.link.flush()
        return row
