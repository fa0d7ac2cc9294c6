"""A completion's text as it streams, cut at the first stop string.

Text that could be the beginning of a stop string is held back until the next pieces show
whether it is one (llama-server does the same), so a client never receives part of a stop
string; the stop string itself is never sent.
"""

from __future__ import annotations

from typing import Sequence


class StopText:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.text = ""          # everything sent so far
        self._held = ""         # received, not sent yet
        self.stopped = False

    def push(self, piece: str) -> str:
        """Take the next piece of text; what may be sent now ("" once stopped)."""
        if self.stopped:
            return ""
        held = self._held + piece
        cut = min((i for i in (held.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return self._send(held[:cut])
        keep = self._partial(held)
        self._held = held[len(held) - keep:] if keep else ""
        return self._send(held[:len(held) - keep])

    def finish(self) -> str:
        """The text held back, at the end of the generation."""
        rest, self._held = ("" if self.stopped else self._held), ""
        return self._send(rest)

    def _partial(self, text: str) -> int:
        """Length of the longest end of `text` that begins some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best

    def _send(self, text: str) -> str:
        self.text += text
        return text
