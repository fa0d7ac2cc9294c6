"""Each rank's copy, on its own host's disk, of the KV cells its stage holds for every request
a served job generates, so that a job started after a failure takes them back instead of
evaluating every request's context again (engine/head/kept.py decides what is kept and
when; job/restore.py brings the copies back at start-up).

One file per request and stage, `<key>-<stage identity>.cells`, written whole (a new file
renamed over the old one, so a reader sees either copy whole, never a partial one) each time
the head asks (a KvOp KV_SEQ_SAVE: the request's canonical sequence holds the cells of its
first `n` accepted tokens then), and removed when the request ends (KV_SEQ_DROP). The head
writes `<key>.tokens` beside them: the tokens those cells are of, which only it knows.

A copy is taken back only if it is whole and of these very layers: same model, same
layers [first, last) (in the header too), same settings that choose kernels and batches,
same llama.cpp build and CPU features (`identity`); then its cells are the same bits a
rebuild computes (the runs that made them were of the sizes a rebuild uses:
schedule/speculation.py). Anything else is left unused, with the reason. A worker also
keeps, under REPLICAS, the copies of some layers its neighbours send it
(engine/worker/replicas.py), from which a stage is assembled after a host is lost
(job/assemble.py).

Keeping is on only under a front (`serve --ranks`): the directory is named after the
front's channel key, so a copy is never taken by another server's job.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from .models import cache_dir

log = logging.getLogger(__name__)

KEY_ENV = "PIPEINFER_FRONT_KEY"      # the front's channel key (front/channel.py sets it)
OFF_ENV = "PIPEINFER_KEEP_CELLS"     # "0": keep nothing (to measure what keeping costs)
MAGIC = b"PIKC2\n"
HEADER = struct.Struct("<6s32sqqqqqIii")   # magic, identity, key, n, digest, n_prompt,
                                           # n_tokens, crc32 of the body, first and last layer
REPLICAS = "replicas"                # the subdirectory of copies other ranks sent this one
DRAFT = "draft"                      # the head's subdirectory of its draft model's contexts
TOKENS = "tokens"                    # the head's token file's identity
STALE_S = 24 * 3600.0                # another front's directory untouched this long: removed
ORPHAN_S = 1800.0                    # a copy not rewritten this long belongs to no request


def front_dir(environ=os.environ) -> Path | None:
    """This rank's directory for what its front's jobs keep (None without a front)."""
    key = environ.get(KEY_ENV, "")
    if not key:
        return None
    return cache_dir() / "kept" / hashlib.sha256(key.encode()).hexdigest()[:16]


def token_digest(tokens: Sequence[int]) -> int:
    """A 31-bit digest of a token prefix (it travels in an int32 field of a KvOp)."""
    return zlib.crc32(np.asarray(tokens, dtype=np.int32).tobytes()) & 0x7FFFFFFF


def identity_of(*parts) -> bytes:
    return hashlib.sha256(repr(parts).encode()).digest()


@dataclass(frozen=True)
class Kept:
    """One copy read back: its request's key, how many leading positions it holds cells of,
    their tokens' digest (and, in the head's token file, the tokens and the prompt's
    length); `body` is the sequence state llama.cpp wrote, or the tokens; `identity` and
    `layers` [first, last) those of the stage whose cells they are."""
    key: int
    n: int
    digest: int
    n_prompt: int
    tokens: tuple[int, ...]
    body: bytes
    identity: bytes = b""
    layers: tuple[int, int] = (0, 0)


class KeptCells:
    """The copies of one rank's stage (`identity`: identity_of what makes its cells)."""

    def __init__(self, directory: Path, identity: bytes, layers: tuple[int, int] = (0, 0)):
        self.dir, self.identity, self.layers = Path(directory), identity, tuple(layers)
        self._suffix = self._suffix_of(identity)
        self._warned = False
        self.writer = None   # a kept_writer.Writer: writes go on its thread

    @classmethod
    def for_job(cls, identity: bytes, layers: tuple[int, int] = (0, 0), sub: str = "",
                environ=os.environ) -> "KeptCells | None":
        """The store of a job a front launched (None otherwise, or when turned off); `sub`:
        a subdirectory (REPLICAS)."""
        directory = front_dir(environ)
        if directory is None or environ.get(OFF_ENV, "").strip() == "0":
            return None
        return cls(directory / sub if sub else directory, identity, layers)

    @staticmethod
    def _suffix_of(identity: bytes) -> str:
        return ".tokens" if identity == identity_of(TOKENS) else f"-{identity.hex()[:16]}.cells"

    def path(self, key: int, identity: bytes | None = None) -> Path:
        suffix = self._suffix if identity is None else self._suffix_of(identity)
        return self.dir / f"{key}{suffix}"

    # --- writing -------------------------------------------------------------------------
    def save(self, key: int, n: int, digest: int, body: bytes, n_prompt: int = 0,
             tokens: Sequence[int] = ()) -> None:
        """Write a request's copy of this store's stage whole."""
        self.write(Kept(key, n, digest, n_prompt, tuple(tokens), body, self.identity,
                        self.layers))

    def write(self, copy: Kept) -> None:
        """Write a copy whole, under its own identity (a failure to write is logged once,
        not raised: a request is never failed for its copy)."""
        self._do(self._write, copy)

    def _do(self, fn, *args) -> None:
        """fn(*args) now, or on the writer's thread in order (`writer`: kept_writer.py)."""
        if self.writer is None:
            fn(*args)
        else:
            self.writer.do(fn, *args)

    def flush(self) -> None:
        """Wait until every write and removal asked for is done."""
        if self.writer is not None:
            self.writer.flush()

    def _write(self, copy: Kept) -> None:
        raw = np.asarray(copy.tokens, dtype=np.int32).tobytes()
        header = HEADER.pack(MAGIC, copy.identity, copy.key, copy.n, copy.digest,
                             copy.n_prompt, len(copy.tokens),
                             zlib.crc32(copy.body, zlib.crc32(raw)), *copy.layers)
        target = self.path(copy.key, copy.identity)
        tmp = target.with_suffix(target.suffix + f".{os.getpid()}.tmp")
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(raw)
                f.write(copy.body)
            os.replace(tmp, target)
        except OSError as err:
            if not self._warned:
                log.warning("kept cells: cannot write %s (%s); a failure will evaluate "
                            "its requests again", target, err)
                self._warned = True

    def drop(self, key: int) -> None:
        self._do(self._unlink, self.path(key))

    @staticmethod
    def _unlink(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass

    def drop_every(self, but=()) -> None:
        """Remove every copy here, whatever stage it is of, except those of requests `but`."""
        self._do(self._drop_every, frozenset(but))

    def _drop_every(self, but) -> None:
        for key in set(self.keys(every=True)) - but:
            self._drop_all(key)

    def drop_all(self, key: int) -> None:
        """Remove every copy of request `key` here, whatever stage it is of."""
        self._do(self._drop_all, key)

    def _drop_all(self, key: int) -> None:
        for p in self._files_of(key):
            self._unlink(p)

    def save_stage(self, stage, slot: int, seq: int, key: int, n: int, digest: int) -> None:
        """`stage`'s cells of `seq` in context `slot` (all of them: a reader keeps the
        first `n`)."""
        self.save(key, n, digest, stage.seq_state(seq, slot=slot))

    # --- reading -------------------------------------------------------------------------
    def read(self, key: int) -> tuple[Kept | None, str]:
        """The copy of request `key` of this store's stage, or None and why it cannot be
        used."""
        copy, why = _read(self.path(key), key)
        if copy is not None and copy.identity != self.identity:
            return None, "of another model, split or build"
        return copy, why

    def copies_of(self, key: int) -> list[Kept]:
        """Every whole copy of request `key` here, whatever stage it is of."""
        return [copy for p in self._files_of(key) if (copy := _read(p, key)[0]) is not None]

    def _files_of(self, key: int) -> list[Path]:
        return sorted(self.dir.glob(f"{key}-*.cells")) if self.dir.is_dir() else []

    def keys(self, every: bool = False) -> list[int]:
        """The keys of this store's copies (`every`: of copies of any stage here), most
        recently written first."""
        try:
            entries = [(p.stat().st_mtime, p) for p in self.dir.iterdir()]
        except OSError:
            return []
        found = []
        for mtime, p in sorted(entries, reverse=True):
            if every:
                head = p.name.split("-")[0] if p.name.endswith(".cells") else ""
            else:
                head = p.name[:-len(self._suffix)] if p.name.endswith(self._suffix) else ""
            if head.isdigit() and int(head) not in found:
                found.append(int(head))
        return found

    def clear(self) -> None:
        """Remove this store's copies (the job ends in order: nothing is resumed)."""
        self._do(self._clear)

    def _clear(self) -> None:
        for key in self.keys():
            self._unlink(self.path(key))

    def sweep(self, now: float | None = None) -> None:
        """Remove other fronts' directories untouched for STALE_S (a front killed outright
        never removed its own), and in this one temporary files left over and copies not
        rewritten for ORPHAN_S: a request under way rewrites its copies every few tokens,
        and those of a split no job uses any more (a host was lost) are never read again."""
        now = time.time() if now is None else now
        for p in (self.dir.iterdir() if self.dir.is_dir() else ()):
            try:
                if now - p.stat().st_mtime > (60 if p.suffix == ".tmp" else ORPHAN_S):
                    p.unlink()
            except OSError:
                pass
        for other in (self.dir.parent.iterdir() if self.dir.parent.is_dir() else ()):
            try:
                if other != self.dir and now - other.stat().st_mtime > STALE_S:
                    for p in other.iterdir():
                        p.unlink()
                    other.rmdir()
            except OSError:
                pass


def _read(path: Path, key: int) -> tuple[Kept | None, str]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, "no copy"
    except OSError as err:
        return None, f"unreadable: {err}"
    if len(data) < HEADER.size:
        return None, "truncated"
    magic, identity, k, n, digest, n_prompt, n_tokens, crc, first, last = \
        HEADER.unpack_from(data)
    payload = data[HEADER.size:]
    if magic != MAGIC:
        return None, "not a copy of cells"
    if k != key or len(payload) < 4 * n_tokens or zlib.crc32(payload) != crc:
        return None, "truncated or damaged"
    tokens = tuple(int(t) for t in np.frombuffer(payload[:4 * n_tokens], dtype=np.int32))
    return Kept(key, n, digest, n_prompt, tokens, payload[4 * n_tokens:], identity,
                (first, last)), ""


def load_into(stage, slot: int, seq: int, kept: Kept) -> bool:
    """Put a copy's cells into `seq` of context `slot` (emptied first): whether llama.cpp
    took them."""
    stage.clear(slot)
    return stage.set_seq_state(seq, kept.body, slot=slot)

