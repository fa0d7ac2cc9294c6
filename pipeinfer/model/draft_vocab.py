"""Reduced-vocabulary drafts (FR-Spec): the draft's output head over its K likeliest tokens.

The draft model only guesses; the target verifies every guess over its full vocabulary, so
a draft that can only propose K of the vocabulary's tokens changes what is accepted, never the
output. Its output head is one of its largest costs per token: for Qwen2.5-Coder 0.5B's
compact copy, output.weight is 896 x 151,936 Q4_0, 76.6 MB of the ~278 MB read per draft
token, and every logits row the head then scans (softmax, the two best) has 151,936 floats.

The kept set: every control and user-defined token (EOS, <|im_end|>, tool-call markers...),
then the tokens the draft's tokenizer produces most often on a corpus that every machine has
offline, the Python standard library's sources (code and English docstrings, the first
CORPUS_BYTES of its .py files in path order: ~1.5 s to tokenize), ties and unseen tokens in id
order (BPE ids are merge ranks: low ids are the common merges). Unused (padding) tokens are
never kept.

The reduced file (`write_reduced`): every layer, the final norm, and output.weight with only
the kept rows (same type, rows copied as bytes), declaring a vocabulary of K tokens with no
tokenizer (as stage files do, slicing.py). llama.cpp requires token_embd at [n_embd, K], but
this file is fed embeddings (the head gathers the input tokens' rows from the full draft file,
model/draft_vocab_stage.py), so it gets zeros in a small block type. output.weight stays a
tensor of its own rather than standing in for token_embd (slicing.TIED_OUTPUT_ARCHS): llama.cpp
keeps token_embd out of its repacked layout (a row-gather table), and the output product is
what this file is for. The kept ids travel in the file's metadata (KEPT_KEY), so a file and
its map never part. `reduced_draft` caches the file under ``<cache>/draft-vocab/``.
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, Keys, MODEL_TENSOR, TENSOR_NAMES

from .gguf_header import Header, HeaderError, check_extents, read_header
from .models import ModelError, Progress, cache_dir, locked, say
from .slicing import FILLER_TYPES, kv_key, kv_string, kv_uint32, model_info, write_gguf

log = logging.getLogger(__name__)

DRAFT_VOCAB_VERSION = 1     # bump when the reduced file's contents change (cache key)
KEPT_KEY = "pipeinfer.draft_vocab.token_ids"   # int32 array: row i is token id kept[i]
CORPUS_KEY = "pipeinfer.draft_vocab.corpus"    # what the frequencies were counted on
CORPUS_BYTES = 4_000_000
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib"})
_TOKEN_TYPE = Keys.Tokenizer.TOKEN_TYPE
_SPECIAL_TYPES = (3, 4)     # llama.cpp's token types CONTROL and USER_DEFINED: always kept
_UNUSED_TYPE = 5            # UNUSED (padding rows): never kept
_TOKEN_EMBD = TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight"
_OUTPUT = TENSOR_NAMES[MODEL_TENSOR.OUTPUT] + ".weight"


class DraftVocabError(ModelError):
    """The draft cannot be given a reduced vocabulary of that size; the message says why."""


def draft_vocab_dir() -> Path:
    return cache_dir() / "draft-vocab"


# --- the kept set ----------------------------------------------------------------------------

def corpus_files(limit: int = CORPUS_BYTES) -> Iterator[Path]:
    """The standard library's .py files in path order (no tests, no installed packages),
    until `limit` bytes have been given."""
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            total += path.stat().st_size
        except OSError:
            continue
        yield path
        if total >= limit:
            return


def corpus_name() -> str:
    return (f"python{sys.version_info[0]}.{sys.version_info[1]} standard library, "
            f"first {CORPUS_BYTES / 1e6:g} MB of .py files")


def token_counts(draft: Path, n_vocab: int) -> np.ndarray:
    """How often the draft's tokenizer gives each token id on the corpus."""
    from .tokenizer import Tokenizer   # (llama.cpp; only making the file needs it)

    tokenizer = Tokenizer(draft)
    counts = np.zeros(n_vocab, dtype=np.int64)
    try:
        for path in corpus_files():
            try:
                text = path.read_text("utf-8", errors="replace")
            except OSError:
                continue
            ids = tokenizer.tokenize(text, add_special=False, parse_special=False)
            counts += np.bincount(ids, minlength=n_vocab)[:n_vocab]
    finally:
        tokenizer.close()
    return counts


def choose_kept(counts: np.ndarray, token_types: np.ndarray | None, k: int) -> np.ndarray:
    """The K kept token ids, ascending: the special ones, then by count (ties: lower id
    first), never unused ones. DraftVocabError if K cannot hold the special tokens or is
    more than the usable vocabulary."""
    n_vocab = counts.size
    types = np.ones(n_vocab, dtype=np.int64) if token_types is None else token_types
    special = np.flatnonzero(np.isin(types, _SPECIAL_TYPES))
    usable = np.flatnonzero(types != _UNUSED_TYPE)
    if k > usable.size:
        raise DraftVocabError(f"--draft-vocab {k} is more than the draft's {usable.size} "
                              f"usable tokens (vocabulary of {n_vocab}); give at most "
                              f"{usable.size}, or 0 for the full vocabulary")
    if k < special.size:
        raise DraftVocabError(f"--draft-vocab {k} cannot hold the draft's {special.size} "
                              "special tokens (end of generation, chat and tool-call markers)")
    rest = np.setdiff1d(usable, special)
    by_count = rest[np.lexsort((rest, -counts[rest]))]   # most frequent first, then by id
    return np.sort(np.concatenate([special, by_count[:k - special.size]])).astype(np.int32)


# --- the reduced file ------------------------------------------------------------------------

def check_draft(header: Header, path: Path) -> None:
    """DraftVocabError unless `path` is a whole, single-file model with token embeddings and
    a tokenizer (which counts the corpus)."""
    if int(header.fields.get(Keys.Split.LLM_KV_SPLIT_COUNT, 1) or 1) > 1:
        raise DraftVocabError(f"{path.name} is one part of a split GGUF model; --draft-vocab "
                              "needs the draft as a single file (llama-gguf-split --merge)")
    if _TOKEN_EMBD not in header.tensors:
        raise DraftVocabError(f"{path.name} has no {_TOKEN_EMBD} (a pipeinfer stage file?): "
                              "--draft-vocab needs the draft model's own file")
    if header.fields.get(Keys.Tokenizer.MODEL, "none") == "none":
        raise DraftVocabError(f"{path.name} has no tokenizer (a pipeinfer stage file or a "
                              "reduced draft?): --draft-vocab needs the draft model's own file")
    try:
        check_extents(header)
    except HeaderError as err:
        raise DraftVocabError(str(err)) from None


def write_reduced(src: Path, dst: Path, kept: np.ndarray, corpus: str = "") -> None:
    """Write `src` with an output head of the rows `kept` only (module docstring) to `dst`,
    through a temporary name (a crash leaves no partial file under the final name)."""
    header = read_header(src)
    check_draft(header, src)
    info = model_info(header, src)
    kept = np.asarray(kept, dtype=np.int32)
    kvs = _reduced_kvs(header, info.arch, kept, corpus)
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.partial")
    try:
        with open(src, "rb") as handle, \
                mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf, \
                open(tmp, "wb") as out:
            tensors = _reduced_tensors(header, buf, kept)
            write_gguf(out, buf, kvs, tensors, header.alignment, lambda i: None)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _reduced_kvs(header: Header, arch: str, kept: np.ndarray, corpus: str) -> list:
    """Every metadata entry but the tokenizer's, a "none" tokenizer of len(kept) rows, and
    the kept ids."""
    vocab_key = Keys.LLM.VOCAB_SIZE.format(arch=arch)
    kvs = [span for key, span in header.kv_spans.items()
           if not key.startswith("tokenizer.") and key != vocab_key]
    ids = struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.INT32, kept.size) \
        + kept.astype("<i4").tobytes()
    return kvs + [kv_key(Keys.Tokenizer.MODEL) + kv_string("none"),
                  kv_key(vocab_key) + kv_uint32(kept.size),
                  kv_key(KEPT_KEY) + ids, kv_key(CORPUS_KEY) + kv_string(corpus)]


def _reduced_tensors(header: Header, buf, kept: np.ndarray) -> list:
    """(name, dims, type, data) as slicing.write_gguf takes them: the layers and norms as
    spans of the source, output.weight's kept rows as bytes, token_embd as zeros."""
    head = header.tensors.get(_OUTPUT) or header.tensors[_TOKEN_EMBD]  # (tied: the embeddings)
    n_embd = head.shape[0]
    rows = np.frombuffer(buf, dtype=np.uint8, count=head.shape[1] * head.row_bytes,
                         offset=head.offset).reshape(head.shape[1], head.row_bytes)
    tensors = []
    for t in header.tensors.values():
        if t.name == _TOKEN_EMBD:
            tensors.append(_zero_embedding(n_embd, kept.size))
        elif t.name != _OUTPUT:
            tensors.append((t.name, t.shape, t.ggml_type, (t.offset, t.n_bytes)))
    tensors.append((_OUTPUT, (n_embd, kept.size), head.ggml_type, rows[kept].tobytes()))
    return tensors


def _zero_embedding(n_embd: int, n_rows: int) -> tuple:
    """token_embd, never read (the file takes embeddings) yet required at [n_embd, n_rows]:
    zeros in the smallest block type that fits, else f16."""
    for ttype, block, nbytes in FILLER_TYPES:
        if n_embd % block == 0:
            return (_TOKEN_EMBD, (n_embd, n_rows), ttype, bytes(n_embd // block * nbytes * n_rows))
    return (_TOKEN_EMBD, (n_embd, n_rows), GGMLQuantizationType.F16, bytes(2 * n_embd * n_rows))


def read_kept(path: str | os.PathLike) -> np.ndarray:
    """The token id of each output row of a reduced file (int32, ascending)."""
    header = read_header(path)
    if KEPT_KEY not in header.fields:
        raise DraftVocabError(f"{path} is not a reduced-vocabulary draft (no {KEPT_KEY})")
    return np.asarray(header.fields[KEPT_KEY], dtype=np.int32)


# --- the cache --------------------------------------------------------------------------------

def reduced_draft(draft: str | os.PathLike, k: int, progress: Progress = None, *,
                  header: Header | None = None) -> Path:
    """The reduced-vocabulary file (K output rows) of the draft model file `draft`, made on
    first use (seconds: tokenizing the corpus, copying the layers) under
    ``<cache>/draft-vocab/<draft's digest>-k<K>-v<N>.gguf`` and an exclusive lock, so ranks
    or jobs starting together make it once. DraftVocabError for a K or a file that cannot
    work; ModelError if the cache cannot be written. `header`: `draft`'s, if already
    parsed."""
    from .stage_cache import content_digest

    draft = Path(draft)
    header = header if header is not None else read_header(draft)
    check_draft(header, draft)
    n_vocab = header.tensors[_TOKEN_EMBD].shape[1]
    if not 0 < k <= n_vocab:
        raise DraftVocabError(f"--draft-vocab {k}: the draft's vocabulary has {n_vocab} tokens; "
                              f"give 1 to {n_vocab}, or 0 for the full vocabulary")
    out = draft_vocab_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
        key = f"{content_digest(draft)[:32]}-k{k}-v{DRAFT_VOCAB_VERSION}"
        dst = out / f"{key}.gguf"
        if dst.exists():   # files reach their final name only complete (write_reduced)
            return dst
        waiting = f"draft model {draft.name}: waiting for another process making its " \
                  f"{k}-token draft"
        with locked(out / f"{key}.lock", progress, waiting):
            if not dst.exists():
                _make(draft, header, k, dst, progress)
        return dst
    except OSError as err:
        raise ModelError(f"reduced-vocabulary draft cache {out} is not writable "
                         f"({err.strerror or err}); set PIPEINFER_CACHE to a writable "
                         "directory or run without --draft-vocab") from None


def _make(draft: Path, header: Header, k: int, dst: Path, progress: Progress) -> None:
    say(log, progress, f"draft model {draft.name}: choosing its {k} most frequent tokens and "
                  f"writing its reduced-vocabulary copy (once, seconds) in {dst.parent}")
    n_vocab = header.tensors[_TOKEN_EMBD].shape[1]
    types = header.fields.get(_TOKEN_TYPE)
    types = None if types is None or len(types) != n_vocab else np.asarray(types)
    kept = choose_kept(token_counts(draft, n_vocab), types, k)
    write_reduced(draft, dst, kept, corpus_name())
