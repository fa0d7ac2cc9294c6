"""A pipeline stage: one contiguous slice of a model's layers, evaluated by stock llama.cpp.

A stage file comes from slicing.py. Non-final stages take activations (or, for the whole-model
case, token ids) and return the activations after their last layer, captured by the native eval
callback; the final stage returns logits. KV operations and cancellation act on the stage's own
llama.cpp context; a stage of a server that generates several requests at once has one context
per *slot* (one model, its weights loaded once), so every request's KV cells live apart and it
computes exactly as it would alone. With `refill_ctx`, each slot also has a *refill
context* (index n_slots + slot, one sequence, `refill_ctx` cells): a conversation's answer is
evaluated again there as prompt while it is generated, after the slot's exact prefix was
copied in (seed), and copied back at the end (engine/head/refill.py).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, replace
from typing import Sequence

import llama_cpp
import numpy as np

from . import llama_lib
from .batch import Batch

from .. import _native
from .llama_lib import LlamaError

DECODE_OK, DECODE_NO_SLOT, DECODE_ABORTED = 0, 1, 2
MMAP_VAR = "PIPEINFER_MMAP"  # "1": map weight files instead of reading them (to compare memory use)


# Rows of logits one decode of the target's last stage or a draft model may ask for: runs are a
# few tokens and a prompt chunk asks for its last row only (a smaller compute buffer: 39 MB of
# logits for Qwen2.5's vocabulary instead of 300).
MAX_OUTPUTS = 64


@dataclass(frozen=True)
class StageConfig:
    n_ctx: int = 2048
    n_batch: int = 512        # largest batch one decode accepts (also n_ubatch: one graph)
    n_seq_max: int = 64       # sequence ids 0..n_seq_max-1 (kv_unified: no memory cost)
    n_threads: int = 1
    repack: bool = True       # llama.cpp's weight repacking (extra buffer types)
    n_slots: int = 1          # llama.cpp contexts (each n_ctx cells): requests generated at once
    mmap: bool = False        # map the file instead of reading it (see Stage._load)
    max_outputs: int = 0      # rows of logits one decode may ask for (0: n_batch); see _Context
    refill_ctx: int = 0       # cells of each slot's refill context (0: none; see above)
    refill_batch: int = 64    # largest batch a refill context takes (the prompt's chunk)

    def refill(self) -> "StageConfig":
        """A refill context's configuration: its cells, one sequence, batches of a chunk."""
        return replace(self, n_ctx=self.refill_ctx, n_batch=self.refill_batch, n_seq_max=1,
                       n_slots=1, refill_ctx=0)


def refill_context(slot: int, n_slots: int) -> int:
    """The index of slot `slot`'s refill context among a stage's contexts."""
    return n_slots + slot


def drop_page_cache(path: str) -> None:
    """Ask the kernel to drop `path`'s cached pages (read once, never needed again)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def trim_heap() -> None:
    """Give the C heap's free memory back to the system (glibc): loading leaves freed read
    buffers below the heap's top, ~11 MB of Qwen2.5's last stage."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class StageAborted(Exception):
    """A decode was cancelled mid-way; the KV cache is as it was before it."""


class Stage:
    """Owner of one llama.cpp model + context pair evaluating a slice of layers."""

    def __init__(self, path: str | os.PathLike, config: StageConfig = StageConfig(),
                 *, final: bool | None = None, label: str = "stage"):
        llama_lib.init()
        self.path = str(path)
        self.config = config
        self.label = label
        self._model = None
        self._slots: list[_Context] = []
        try:
            self._load(final)
        except BaseException:
            self.close()
            raise

    # --- lifetime -------------------------------------------------------------------------
    def _load(self, final: bool | None) -> None:
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0
        # (extra buffer types: repacked weights; never with AMX, see llama_lib.amx_compiled)
        mparams.use_extra_bufts = llama_lib.repacks(self.config.repack)
        # Read, not mapped: a mapping keeps the file's pages in the node's memory (charged to
        # its cgroup) besides the repacked copies llama.cpp makes of most tensors, and the
        # tensors it does not repack are read from the mapping at every step, so under a
        # memory limit those pages thrash. Read into llama.cpp's own buffers, the weights
        # are held once; the file's pages are then dropped from the page cache.
        mmap = self.config.mmap or os.environ.get(MMAP_VAR, "") == "1"
        mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if mmap else \
            llama_cpp.LLAMA_LOAD_MODE_NONE
        self._model = llama_cpp.llama_model_load_from_file(self.path.encode(), mparams)
        if not self._model:
            raise LlamaError(f"{self.label}: llama.cpp could not load {self.path}: "
                             f"{llama_lib.recent_log(3)}")
        if not mmap:
            drop_page_cache(self.path)
        vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self.n_embd = llama_cpp.llama_model_n_embd(self._model)
        self.n_layer = llama_cpp.llama_model_n_layer(self._model)
        self.final = self.n_vocab > 1 if final is None else final
        for _ in range(self.config.n_slots):
            self._slots.append(_Context(self, self.config))
        if self.config.refill_ctx:   # (after the slots': refill_context's numbering)
            for _ in range(self.config.n_slots):
                self._slots.append(_Context(self, self.config.refill()))
        trim_heap()

    def close(self) -> None:
        """Free the contexts, then the model. Safe to call twice."""
        for context in self._slots:
            context.free()
        self._slots.clear()
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    @property
    def n_slots(self) -> int:
        """Contexts that generate (refill contexts, if any, follow them)."""
        return self.config.n_slots

    @property
    def has_refill_contexts(self) -> bool:
        return self.config.refill_ctx > 0

    def slot(self, slot: int) -> "StageSlot":
        """This stage seen through one of its contexts (what a draft model per request uses)."""
        self._slots[slot]  # (an IndexError now, not at the first decode)
        return StageSlot(self, slot)

    def __enter__(self) -> "Stage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- compute --------------------------------------------------------------------------
    def decode(self, positions: Sequence[int], seq_ids: Sequence[Sequence[int]], *,
               embd: np.ndarray | None = None, tokens: Sequence[int] | None = None,
               logit_rows: Sequence[bool] | None = None, run_id: int = 0,
               slot: int = 0, states: bool = False) -> np.ndarray:
        """Evaluate one batch in context `slot`. Returns float32 activations [n, n_embd]
        (non-final stage) or logits [rows asked, n_vocab] (final stage; every row unless
        `logit_rows` says which; with `states`, the final hidden states [rows asked, n_embd]
        instead: llama.cpp's embeddings, the output norm applied, not pooled).
        Raises StageAborted if `cancel(run_id)` was called before or during the decode."""
        n = len(positions)
        context = self._slots[slot]
        if n == 0 or n > context.n_batch:
            raise LlamaError(f"{self.label}: batch of {n} tokens (allowed 1..{context.n_batch})")
        if (embd is None) == (tokens is None):
            raise ValueError("give exactly one of embd or tokens")
        batch = context.batch(embd is not None)
        rows = [True] * n if logit_rows is None or not self.final else list(logit_rows)
        if self.final and self.config.max_outputs and sum(rows) > self.config.max_outputs:
            raise LlamaError(f"{self.label}: {sum(rows)} rows of logits asked for in one "
                             f"decode (at most {self.config.max_outputs})")
        batch.fill(positions, seq_ids, rows, embd=embd, tokens=tokens)
        out = None
        if not self.final:
            out = np.empty((n, self.n_embd), dtype=np.float32)
            _native.state_reset(context.state, out.ctypes.data, out.nbytes)
        states = states and self.final
        _native.set_active_run(context.state, run_id)
        if states:
            llama_cpp.llama_set_embeddings(context.ctx, True)
        try:
            rc = llama_cpp.llama_decode(context.ctx, batch.batch)
        finally:
            _native.set_active_run(context.state, -1)
            if states:
                llama_cpp.llama_set_embeddings(context.ctx, False)
        if rc == DECODE_ABORTED:
            self._forget(positions, seq_ids, slot)
            raise StageAborted(run_id)
        if rc != DECODE_OK:
            reason = "no free KV cache slot (context full)" if rc == DECODE_NO_SLOT else \
                llama_lib.recent_log(2)
            raise LlamaError(f"{self.label}: llama_decode failed ({rc}): {reason}")
        if out is not None:
            used, overflow = _native.state_captured(context.state)
            if overflow or used != out.nbytes:
                raise LlamaError(f"{self.label}: captured {used} of {out.nbytes} activation "
                                 "bytes (n_ubatch smaller than the batch?)")
            return out
        n_out, width = sum(rows), self.n_embd if states else self.n_vocab
        ptr = (llama_cpp.llama_get_embeddings if states else llama_cpp.llama_get_logits)(
            context.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out * width,)).reshape(n_out, width).copy()

    def _forget(self, positions: Sequence[int], seq_ids: Sequence[Sequence[int]],
                slot: int) -> None:
        """After an abort, drop whatever the batch left in the cache for its sequences."""
        first: dict[int, int] = {}
        for pos, seqs in zip(positions, seq_ids):
            for s in seqs:
                first[s] = min(pos, first.get(s, pos))
        for s, p0 in first.items():
            llama_cpp.llama_memory_seq_rm(self._slots[slot].mem, s, p0, -1)

    def cancel(self, run_id: int) -> None:
        """Abort `run_id` if it is being decoded now (in any slot), or make its decode abort
        at once. Thread-safe: meant to be called while another thread is inside decode()."""
        for context in self._slots:
            _native.set_abort_run(context.state, run_id)

    @property
    def abort_polls(self) -> int:
        return sum(_native.polls(context.state) for context in self._slots)

    # --- KV cache (of context `slot`) ---------------------------------------------------
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1, slot: int = 0) -> None:
        llama_cpp.llama_memory_seq_cp(self._slots[slot].mem, src, dst, p0, p1)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1, slot: int = 0) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._slots[slot].mem, seq, p0, p1):
            raise LlamaError(f"{self.label}: seq_rm({seq}, {p0}, {p1}) refused")

    def seq_keep(self, seq: int, slot: int = 0) -> None:
        llama_cpp.llama_memory_seq_keep(self._slots[slot].mem, seq)

    def seq_compact(self, seq: int, slot: int = 0) -> None:
        """Move `seq`'s cells (the only sequence left in context `slot`) to the front of the
        cache, keeping their order and bits: llama.cpp's sequence state, read out and written
        back (writing removes the sequence first, and the emptied cache takes it from cell 0).
        Why: a later batch then lands right after them instead of in the holes dropped
        sequences left, which would reorder attention's sums (transaction.seq_compact)."""
        ctx = self._slots[slot].ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        got = llama_cpp.llama_state_seq_get_data(ctx, buf, size, seq)
        if got != size or not llama_cpp.llama_state_seq_set_data(ctx, buf, size, seq):
            raise LlamaError(f"{self.label}: could not compact sequence {seq} ({size} bytes): "
                             f"{llama_lib.recent_log(3)}")

    def seed(self, seq: int, src: int, n: int, slot: int) -> None:
        """Context `slot` emptied, then given `seq`'s cells of context `src` at positions below
        `n` (all with n < 0), in their cell order from cell 0, bits unchanged: where a
        context that computed only them holds them (a refill context's start, and the slot
        taking the refilled cells back)."""
        self.clear(slot=slot)
        if not self.set_seq_state(seq, self.seq_state(seq, slot=src), slot=slot):
            raise LlamaError(f"{self.label}: context {slot} could not take sequence {seq} of "
                             f"context {src}: {llama_lib.recent_log(3)}")
        if n >= 0:
            self.seq_rm(seq, n, -1, slot=slot)

    def seq_state(self, seq: int, slot: int = 0) -> memoryview:
        """`seq`'s cells in context `slot` as llama.cpp writes a sequence's state (bytes
        in a buffer of their own: not copied again, a context's cells are megabytes)."""
        ctx = self._slots[slot].ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, seq)
        buf = np.empty(size, dtype=np.uint8)
        got = llama_cpp.llama_state_seq_get_data(
            ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq)
        if got != size:
            raise LlamaError(f"{self.label}: could not read sequence {seq} ({size} bytes)")
        return memoryview(buf)

    def set_seq_state(self, seq: int, state: bytes, slot: int = 0) -> bool:
        """Cells written by seq_state() into `seq` of context `slot` (which llama.cpp
        empties first): whether llama.cpp took them (it checks the layers and types)."""
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        return bool(llama_cpp.llama_state_seq_set_data(self._slots[slot].ctx, buf,
                                                       len(state), seq))

    def seq_pos_max(self, seq: int, slot: int = 0) -> int:
        """Last cached position of `seq`, -1 when it has none."""
        return llama_cpp.llama_memory_seq_pos_max(self._slots[slot].mem, seq)

    def clear(self, slot: int = 0) -> None:
        llama_cpp.llama_memory_clear(self._slots[slot].mem, True)


class _Context:
    """One llama.cpp context of a stage's model, with its native callback state (activation
    capture, abort) and its batches."""

    def __init__(self, stage: Stage, cfg: StageConfig):
        self.ctx, self.state, self.batches = None, 0, {}
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cfg.n_ctx
        cparams.n_batch = cparams.n_ubatch = cfg.n_batch
        cparams.n_seq_max = cfg.n_seq_max
        cparams.n_threads = cparams.n_threads_batch = cfg.n_threads
        cparams.kv_unified = True  # split batches in token order; seq copies are metadata only
        if stage.final and cfg.max_outputs:
            # llama.cpp sizes its compute buffer for the most logits rows a decode may ask
            # for, n_batch by default: 512 x 151,936 floats (300 MB) for Qwen2.5, where runs
            # ask for a few and a prompt chunk for one. Only the buffer's size changes.
            cparams.n_outputs_max = min(cfg.n_batch, cfg.max_outputs)
        cparams.no_perf = True
        # (hidden states per token, for embeddings: the head pools them, whatever the model's
        # own pooling type)
        cparams.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        get_name, nbytes, tensor_get = llama_lib.ggml_function_addresses()
        self.state = _native.state_new(f"l_out-{stage.n_layer - 1}".encode(),
                                       get_name, nbytes, tensor_get)
        if not stage.final:
            cparams.cb_eval = llama_cpp.ggml_backend_sched_eval_callback(
                llama_lib.EVAL_CALLBACK_ADDRESS)
            cparams.cb_eval_user_data = ctypes.c_void_p(self.state)
        self.ctx = llama_cpp.llama_init_from_model(stage._model, cparams)
        if not self.ctx:
            self.free()
            raise LlamaError(f"{stage.label}: llama.cpp could not create a context for "
                             f"{stage.path} (n_ctx={cfg.n_ctx}): {llama_lib.recent_log(3)}")
        self.abort_cb = llama_cpp.ggml_abort_callback(llama_lib.ABORT_CALLBACK_ADDRESS)
        llama_cpp.llama_set_abort_callback(self.ctx, self.abort_cb, ctypes.c_void_p(self.state))
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_batch, self.n_embd, self.n_seq_max = cfg.n_batch, stage.n_embd, cfg.n_seq_max

    def batch(self, with_embd: bool) -> Batch:
        if with_embd not in self.batches:
            self.batches[with_embd] = Batch(self.n_batch, self.n_embd if with_embd else 0,
                                             self.n_seq_max)
        return self.batches[with_embd]

    def free(self) -> None:
        for batch in self.batches.values():
            batch.free()
        self.batches.clear()
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.state:
            _native.state_free(self.state)
            self.state = 0


class StageSlot:
    """A stage's methods bound to one of its contexts (a Drafter per request uses one)."""

    def __init__(self, stage: Stage, slot: int):
        self.stage, self.index = stage, slot
        self.n_vocab, self.n_embd, self.final = stage.n_vocab, stage.n_embd, stage.final
        self.config, self.label = stage.config, stage.label

    def decode(self, *args, **kw) -> np.ndarray:
        return self.stage.decode(*args, slot=self.index, **kw)

    # (a `slot` given to these is ignored: apply_kv passes the op's, this view has its own)
    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1, slot: int = 0) -> None:
        self.stage.seq_cp(src, dst, p0, p1, slot=self.index)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1, slot: int = 0) -> None:
        self.stage.seq_rm(seq, p0, p1, slot=self.index)

    def seq_keep(self, seq: int, slot: int = 0) -> None:
        self.stage.seq_keep(seq, slot=self.index)

    def seq_compact(self, seq: int, slot: int = 0) -> None:
        self.stage.seq_compact(seq, slot=self.index)

    def seq_pos_max(self, seq: int) -> int:
        return self.stage.seq_pos_max(seq, slot=self.index)

    def seq_state(self, seq: int) -> memoryview:
        return self.stage.seq_state(seq, slot=self.index)

    def set_seq_state(self, seq: int, state: bytes) -> bool:
        return self.stage.set_seq_state(seq, state, slot=self.index)

    def clear(self) -> None:
        self.stage.clear(slot=self.index)

    def cancel(self, run_id: int) -> None:
        self.stage.cancel(run_id)
