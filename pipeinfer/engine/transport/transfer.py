"""Streaming one file from rank 0 to another rank over the job's own transport (no shared disk).

Protocol, per file (all on Tag.WEIGHTS_CTL except the chunks):

    rank 0 -> rank r   Offer {key, size, chunk, digest}       (or Offer with an error)
    rank r -> rank 0   ("ready",) | ("error", message)        (space and cache checked)
    rank 0 -> rank r   ceil(size / chunk) chunks on Tag.WEIGHTS
    rank r -> rank 0   ("ok",) | ("corrupt",) | ("error", message)

A corrupt file (its sha256 is not the offer's) is offered once more, then it is an error.
Memory is bounded on both sides by the chunk size: rank 0 keeps at most WINDOW chunks in
flight per receiver, a receiver one. The receiver writes to a part file of its own and
renames it into the cache only once the checksum matched (and the file is on disk): a
transfer cut short by a dead rank leaves a part file that nothing trusts (the next receiver of
the same key deletes it). If rank 0 cannot read a file while it streams it, zeros stand in
for the rest, the receiver finds the checksum wrong, and rank 0's next offer says why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import shutil
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .wire import Tag

log = logging.getLogger(__name__)

CHUNK = 4 << 20          # bytes a message; memory per transfer is a few of these
CHUNK_VAR = "PIPEINFER_WEIGHTS_CHUNK"  # another chunk size in bytes
WINDOW = 2               # chunks in flight per receiver on rank 0
RESENDS = 1              # a corrupt file is sent once more, then the transfer fails
PROGRESS_EVERY_S = 2.0


class TransferError(RuntimeError):
    """A file could not be sent or received; the message says which and why."""


@dataclass(frozen=True)
class Offer:
    key: str
    size: int
    digest: str
    chunk: int = 0           # 0: CHUNK, or $PIPEINFER_WEIGHTS_CHUNK
    error: str | None = None

    def __post_init__(self):
        if not self.chunk:
            value = os.environ.get(CHUNK_VAR, "")
            object.__setattr__(self, "chunk", int(value) if value.isdigit() and int(value)
                               else CHUNK)

    @property
    def n_chunks(self) -> int:
        return math.ceil(self.size / self.chunk) if self.size else 0

    def chunk_len(self, i: int) -> int:
        return min(self.chunk, self.size - i * self.chunk)


class Sender:
    """Rank 0's side of one file to one rank; `step()` does what can be done without waiting
    and says whether it is finished (then `error` says how it ended)."""

    def __init__(self, link, dest: int, offer: Offer, path: Path | None):
        self.link, self.dest, self.offer, self.path = link, dest, offer, path
        self.tries, self.error, self.done = 0, None, False
        self.reported = False  # the receiver reports the error itself (with its host)
        self.read_error: str | None = None   # rank 0 could not read the file it offered
        self.sent_bytes = 0
        self._file = None
        self._next = 0
        self._inflight: deque = deque()
        self._streaming = False
        link.isend_obj(offer, dest, Tag.WEIGHTS_CTL)
        if offer.error:
            self.done, self.error = True, offer.error

    def step(self) -> bool:
        if self.done:
            return True
        if self._streaming:
            self._stream()
        answer = self.link.poll_obj(self.dest, Tag.WEIGHTS_CTL)
        if answer is not None:
            self._answer(answer[1])
        return self.done

    def _answer(self, answer: tuple) -> None:
        kind = answer[0]
        if kind == "ready":
            self._begin()
        elif kind == "corrupt" and self.read_error:  # what was sent stood for unread bytes
            self._give_up(self.read_error)
        elif kind == "corrupt" and self.tries <= RESENDS:
            log.warning("rank %d: %s arrived corrupt (checksum mismatch); sending it again",
                        self.dest, self.offer.key)
            self._finish_stream()
            self.link.isend_obj(self.offer, self.dest, Tag.WEIGHTS_CTL)
        elif kind == "corrupt":
            self._give_up("it arrived corrupt twice (checksum mismatch)")
            self.reported = True
        else:  # "ok", or the receiver's own error (which it reports itself)
            self._finish_stream()
            self.done, self.reported = True, True
            if kind == "error":
                self.error = answer[1]

    def _give_up(self, error: str) -> None:
        """End with `error`, telling the receiver, which waits for another offer."""
        self._finish_stream()
        self.done, self.error = True, error
        self.link.isend_obj(dataclasses.replace(self.offer, error=error), self.dest,
                            Tag.WEIGHTS_CTL)

    def _begin(self) -> None:
        self.tries += 1
        try:
            self._file = open(self.path, "rb")
        except OSError as err:
            self._file, self.read_error = None, f"cannot read {self.path}: {err.strerror}"
        self._next, self._streaming = 0, True

    def _read(self, n: int) -> np.ndarray:
        """The next n bytes of the file; zeros once it cannot be read (the receiver then
        finds the checksum wrong and is told why: it must not wait for bytes never sent)."""
        data = b""
        if self._file is not None and not self.read_error:
            try:
                data = self._file.read(n)
                if len(data) < n:
                    raise OSError(0, "the file is shorter than offered")
            except OSError as err:
                self.read_error = f"cannot read {self.path}: {err.strerror or err}"
        return np.frombuffer(bytearray(data if len(data) == n else bytes(n)), np.uint8)

    def _stream(self) -> None:
        while self._inflight and self._inflight[0][0]():
            self._inflight.popleft()
        offer = self.offer
        while self._next < offer.n_chunks and len(self._inflight) < WINDOW:
            buf = self._read(offer.chunk_len(self._next))
            self._inflight.append((self.link.isend_tracked(buf, self.dest, Tag.WEIGHTS), buf))
            self.sent_bytes += buf.nbytes
            self._next += 1
        if self._next >= offer.n_chunks and not self._inflight:
            self._finish_stream()

    def _finish_stream(self) -> None:
        self._streaming = False
        if self._file is not None:
            self._file.close()
            self._file = None


def receive(link, directory: Path, label: str) -> tuple[Path, int]:
    """A rank's side: take the file rank 0 offers into `directory` (as <key>.gguf), asking
    again once if it arrives corrupt. (path, bytes received); raises TransferError (after
    telling rank 0) if it cannot be written or stays corrupt."""
    received = 0
    while True:
        offer: Offer = link.recv_obj(0, Tag.WEIGHTS_CTL)
        if offer.error:
            raise TransferError(f"rank 0 could not send {label}: {offer.error}")
        refusal = _check_room(directory, offer)
        if refusal:
            link.isend_obj(("error", refusal), 0, Tag.WEIGHTS_CTL)
            raise TransferError(refusal)
        link.isend_obj(("ready",), 0, Tag.WEIGHTS_CTL)
        part = directory / f"{offer.key}.gguf.part{os.getpid()}"
        digest, error = _take_chunks(link, offer, part, label)
        received += offer.size
        if error:
            link.isend_obj(("error", error), 0, Tag.WEIGHTS_CTL)
            raise TransferError(error)
        if digest != offer.digest:
            part.unlink(missing_ok=True)
            link.isend_obj(("corrupt",), 0, Tag.WEIGHTS_CTL)
            log.warning("%s arrived corrupt (checksum mismatch): discarded", label)
            continue  # rank 0 offers it again, or gives up (an offer with its error)
        dst = directory / f"{offer.key}.gguf"
        os.replace(part, dst)
        link.isend_obj(("ok",), 0, Tag.WEIGHTS_CTL)
        return dst, received


def _check_room(directory: Path, offer: Offer) -> str | None:
    """Why `offer` cannot be written to `directory` (None: it can); stale part files of the
    same key (a transfer cut short earlier) are removed first."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob(f"{offer.key}.gguf.part*"):
            stale.unlink(missing_ok=True)
        free = shutil.disk_usage(directory).free
    except OSError as err:
        return f"cannot write its stage cache {directory}: {err.strerror or err}"
    if free < offer.size:
        return (f"not enough space for {offer.size / 2**20:.0f} MiB in its stage cache "
                f"{directory} ({free / 2**20:.0f} MiB free)")
    return None


def _take_chunks(link, offer: Offer, part: Path, label: str) -> tuple[str, str | None]:
    """Receive every chunk of `offer`, writing them to `part` and hashing them; a write
    error is remembered and the rest drained (the sender's buffers must complete). (sha256,
    error or None)."""
    hasher, error = hashlib.sha256(), None
    buf = np.empty(offer.chunk, np.uint8)
    meter = _Meter(label, offer.size)
    try:
        out = open(part, "wb")
    except OSError as err:
        out, error = None, f"cannot write {part}: {err.strerror or err}"
    for i in range(offer.n_chunks):
        n = link.recv_into(buf, 0, Tag.WEIGHTS)
        view = memoryview(buf)[:n]
        hasher.update(view)
        if out is not None:
            try:
                out.write(view)
            except OSError as err:
                error = f"cannot write {part}: {err.strerror or err}"
                out.close()
                out = None
        meter.add(n)
    if out is not None:
        try:  # on disk before it is renamed into the cache, and out of the page cache
            out.flush()
            os.fsync(out.fileno())
            os.posix_fadvise(out.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            out.close()
        except OSError as err:
            error = f"cannot write {part}: {err.strerror or err}"
    if error:
        part.unlink(missing_ok=True)
    meter.done()
    return hasher.hexdigest(), error


class _Meter:
    """Progress of one receive in the log: bytes, MB/s, ETA, every PROGRESS_EVERY_S."""

    def __init__(self, label: str, size: int):
        self.label, self.size = label, size
        self.got, self.t0 = 0, time.monotonic()
        self.last = self.t0

    def add(self, n: int) -> None:
        self.got += n
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            rate = self.got / max(now - self.t0, 1e-9)
            eta = (self.size - self.got) / rate if rate else float("inf")
            log.info("receiving %s: %.0f of %.0f MB, %.0f MB/s, ETA %.0f s", self.label,
                     self.got / 1e6, self.size / 1e6, rate / 1e6, eta)

    def done(self) -> None:
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        log.info("received %s: %.0f MB in %.1f s (%.0f MB/s)", self.label, self.got / 1e6,
                 elapsed, self.got / elapsed / 1e6)
