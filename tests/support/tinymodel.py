"""Tiny random-weight llama-architecture GGUF models for fast, download-free tests.

``write_tiny_llama`` writes a small llama model that stock llama.cpp loads, with a
real byte-level BPE tokenizer (GPT-2 byte alphabet plus merges learned from a
fixed English/code word list), ChatML special tokens and a chat template.
``write_noisy_copy`` derives a draft model whose alignment with the target is
controlled by a noise level; ``write_unrelated`` gives a badly aligned draft.
All outputs are deterministic: the same arguments give a byte-identical file.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

ARCH = gguf.MODEL_ARCH.LLAMA
ARCH_NAME = gguf.MODEL_ARCH_NAMES[ARCH]
BOS, EOS, IM_START, IM_END = "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (BOS, EOS, IM_START, IM_END)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DEFAULT_N_MERGES = 320

# Most frequent first; weights for BPE training fall off Zipf-like with rank.
_WORDS = """
the of and to a in is that for it as was with be by on not he this are or his from at
which but have an they you were her she there one all we their can has been if more when
will would who so no out up into do about than them then some what only its time new
these two may first any like over also after where most other very just how through
people because could made between well should each such while many those used being
state number world year work between under never same another know system during
def return self import from class None True False print range len for while if else
elif try except with lambda yield assert raise pass break continue value data list
dict name string int float file path test result error index count size model token
""".split()


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_tokenizer(n_merges: int = DEFAULT_N_MERGES) -> tuple[list[str], list[str], list[int]]:
    """Learn ``n_merges`` BPE merges (deterministically) over the built-in word list.

    Returns (tokens, merges, token_types): 256 byte tokens in byte order, one token per
    merge, then the special tokens.
    """
    b2u = bytes_to_unicode()
    enc = lambda s: "".join(b2u[b] for b in s.encode("utf-8"))  # noqa: E731
    freqs: Counter[tuple[str, ...]] = Counter()
    for rank, word in enumerate(dict.fromkeys(_WORDS)):
        weight = 4000 // (rank + 20)
        freqs[tuple(enc(" " + word))] += 4 * weight      # mid-text form, with leading space
        freqs[tuple(enc(word))] += weight                # start-of-text form
    freqs[tuple(enc("    "))] += 200                     # code indentation
    freqs[tuple(enc("\n"))] += 1
    tokens = [b2u[b] for b in range(256)]
    merges: list[str] = []
    known = set(tokens)
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, f in freqs.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += f
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))   # ties broken lexicographically
        merged = best[0] + best[1]
        new: Counter[tuple[str, ...]] = Counter()
        for word, f in freqs.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new[tuple(out)] += f
        freqs = new
        merges.append(f"{best[0]} {best[1]}")
        if merged not in known:
            known.add(merged)
            tokens.append(merged)
    types = [gguf.TokenType.NORMAL] * len(tokens) + [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
    return tokens + list(SPECIAL_TOKENS), merges, [int(t) for t in types]


_UNRELATED_SEED_OFFSET = 0x5EED_0000

_FILE_TYPES = {
    gguf.GGMLQuantizationType.F32: gguf.LlamaFileType.ALL_F32,
    gguf.GGMLQuantizationType.F16: gguf.LlamaFileType.MOSTLY_F16,
    gguf.GGMLQuantizationType.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
}


def _tname(kind: gguf.MODEL_TENSOR, bid: int | None = None) -> str:
    return gguf.TENSOR_NAMES[kind].format(bid=bid) + ".weight"


def _add_weight(writer: gguf.GGUFWriter, name: str, data: np.ndarray,
                qtype: gguf.GGMLQuantizationType) -> None:
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qtype == gguf.GGMLQuantizationType.F32 or data.ndim == 1:
        writer.add_tensor(name, data)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


@dataclass(frozen=True)
class _Dims:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx_train: int
    n_vocab: int

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass(frozen=True)
class TinyLlama:
    """A random-weight llama model's settings: its dimensions, weight seed and scales, the
    block type of its matrices, the size of its byte-level BPE vocabulary and its name.

    Linear weights are N(0, (weight_scale / sqrt(fan_in))^2); token embeddings are
    N(0, 1) so rms-norm inputs are O(1); the (untied) output projection gets
    ``output_scale`` times the base scale so that greedy logits are peaked yet still
    depend on context. Norm weights are 1."""
    n_layer: int = 4
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 2048
    seed: int = 0
    weight_scale: float = 1.0
    output_scale: float = 4.0
    tensor_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32
    n_merges: int = DEFAULT_N_MERGES
    name: str = "pipeinfer-tiny-llama"

    def write(self, path: str | os.PathLike[str]) -> Path:
        """The model as a GGUF file at `path`."""
        if self.tensor_type not in _FILE_TYPES:
            raise ValueError(f"unsupported tensor_type {self.tensor_type!r}")
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError("n_embd must be divisible by n_head, n_head by n_head_kv")
        path = Path(path)
        tokens, merges, types = build_tokenizer(self.n_merges)
        dims = _Dims(self.n_layer, self.n_embd, self.n_head, self.n_head_kv, self.n_ff,
                     self.n_ctx_train, len(tokens))
        tensors = _random_tensors(np.random.default_rng(self.seed), dims, self.weight_scale,
                                  self.output_scale)
        w = gguf.GGUFWriter(path, ARCH_NAME)
        _add_model_keys(w, self.name, self.tensor_type, dims)
        _add_tokenizer_keys(w, tokens, merges, types)
        for tname, data in tensors:
            _add_weight(w, tname, data, self.tensor_type)
        _finish(w)
        return path


def write_tiny_llama(path: str | os.PathLike[str], **settings) -> Path:
    """Write a random-weight llama GGUF model to ``path`` (TinyLlama's `settings`) and return
    it as a Path."""
    return TinyLlama(**settings).write(path)


def _random_tensors(rng: np.random.Generator, d: _Dims, weight_scale: float,
                    output_scale: float) -> list[tuple[str, np.ndarray]]:
    def linear(n_out: int, n_in: int, scale: float = 1.0) -> np.ndarray:
        # numpy (rows=n_out, cols=n_in) == ggml ne = [n_in, n_out]
        return rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(
            scale * weight_scale / np.sqrt(n_in))

    ones = np.ones(d.n_embd, dtype=np.float32)
    T = gguf.MODEL_TENSOR
    tensors: list[tuple[str, np.ndarray]] = [
        (_tname(T.TOKEN_EMBD), rng.standard_normal((d.n_vocab, d.n_embd), dtype=np.float32)),
        (_tname(T.OUTPUT_NORM), ones),
        (_tname(T.OUTPUT), linear(d.n_vocab, d.n_embd, output_scale)),
    ]
    kv = d.head_dim * d.n_head_kv
    for i in range(d.n_layer):
        tensors += [
            (_tname(T.ATTN_NORM, i), ones),
            (_tname(T.ATTN_Q, i), linear(d.n_embd, d.n_embd)),
            (_tname(T.ATTN_K, i), linear(kv, d.n_embd)),
            (_tname(T.ATTN_V, i), linear(kv, d.n_embd)),
            (_tname(T.ATTN_OUT, i), linear(d.n_embd, d.n_embd)),
            (_tname(T.FFN_NORM, i), ones),
            (_tname(T.FFN_GATE, i), linear(d.n_ff, d.n_embd)),
            (_tname(T.FFN_UP, i), linear(d.n_ff, d.n_embd)),
            (_tname(T.FFN_DOWN, i), linear(d.n_embd, d.n_ff)),
        ]
    return tensors


def _add_model_keys(w: gguf.GGUFWriter, name: str, tensor_type, d: _Dims) -> None:
    K, arch = gguf.Keys, ARCH_NAME
    w.add_string(K.General.NAME, name)
    w.add_uint32(K.General.FILE_TYPE, int(_FILE_TYPES[tensor_type]))
    w.add_uint32(K.General.QUANTIZATION_VERSION, gguf.GGML_QUANT_VERSION)
    w.add_uint32(K.LLM.VOCAB_SIZE.format(arch=arch), d.n_vocab)
    w.add_uint32(K.LLM.CONTEXT_LENGTH.format(arch=arch), d.n_ctx_train)
    w.add_uint32(K.LLM.EMBEDDING_LENGTH.format(arch=arch), d.n_embd)
    w.add_uint32(K.LLM.BLOCK_COUNT.format(arch=arch), d.n_layer)
    w.add_uint32(K.LLM.FEED_FORWARD_LENGTH.format(arch=arch), d.n_ff)
    w.add_uint32(K.Attention.HEAD_COUNT.format(arch=arch), d.n_head)
    w.add_uint32(K.Attention.HEAD_COUNT_KV.format(arch=arch), d.n_head_kv)
    w.add_float32(K.Attention.LAYERNORM_RMS_EPS.format(arch=arch), 1e-5)
    w.add_uint32(K.Rope.DIMENSION_COUNT.format(arch=arch), d.head_dim)
    w.add_float32(K.Rope.FREQ_BASE.format(arch=arch), 10000.0)


def _add_tokenizer_keys(w: gguf.GGUFWriter, tokens, merges, types) -> None:
    K = gguf.Keys
    w.add_string(K.Tokenizer.MODEL, "gpt2")
    w.add_string(K.Tokenizer.PRE, "default")
    w.add_array(K.Tokenizer.LIST, tokens)
    w.add_array(K.Tokenizer.TOKEN_TYPE, types)
    w.add_array(K.Tokenizer.MERGES, merges)
    w.add_uint32(K.Tokenizer.BOS_ID, tokens.index(BOS))
    w.add_uint32(K.Tokenizer.EOS_ID, tokens.index(EOS))
    w.add_uint32(K.Tokenizer.EOT_ID, tokens.index(IM_END))
    w.add_bool(K.Tokenizer.ADD_BOS, True)
    w.add_bool(K.Tokenizer.ADD_EOS, False)
    w.add_string(K.Tokenizer.CHAT_TEMPLATE, CHAT_TEMPLATE)


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def copy_gguf(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
              arch: str | None = None, edit=None, extra: dict | None = None,
              alignment: int | None = None, tensor=None) -> Path:
    """Copy GGUF ``src`` to ``dst`` (all metadata, all tensors), changing what is asked:
    ``arch`` renames the architecture (and its keys); ``edit(name, value)`` may change metadata
    values; ``extra`` adds metadata {key: (value, type)}; ``alignment`` sets the data alignment;
    ``tensor(t)`` may return new data for tensor ``t`` (its type then follows the array's dtype),
    or None to copy it unchanged."""
    reader = gguf.GGUFReader(src)
    old = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    w = gguf.GGUFWriter(dst, arch or old)
    if alignment:
        w.add_custom_alignment(alignment)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        name, value = field.name, field.contents()
        if arch and name.startswith(old + "."):
            name = arch + name[len(old):]
        if edit is not None:
            value = edit(name, value)
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, value, vtype, sub_type=sub)
    for key, (value, vtype) in (extra or {}).items():
        sub = gguf.GGUFValueType.INT32 if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    for t in reader.tensors:
        data = tensor(t) if tensor is not None else None
        if data is None:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
        else:
            w.add_tensor(t.name, data)
    _finish(w)
    return Path(dst)


def write_noisy_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                     noise: float, seed: int = 0) -> Path:
    """Copy GGUF ``src`` to ``dst`` (all metadata, all tensors), adding N(0, (noise*std)^2)
    noise to every F32/F16 tensor, std being that tensor's own std. Quantized tensors are
    copied unchanged; ``noise=0`` gives an identical copy of the model."""
    rng = np.random.default_rng(seed)
    float_types = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)

    def noisy(t):
        if t.tensor_type not in float_types:
            return None
        data = np.array(t.data, dtype=np.float32)
        if noise:
            std = float(data.std())
            data += rng.standard_normal(data.shape, dtype=np.float32) * np.float32(noise * std)
        return data.astype(t.data.dtype)

    return copy_gguf(src, dst, tensor=noisy)


def write_unrelated(path: str | os.PathLike[str], seed: int = 0, **kwargs) -> Path:
    """Same shapes and vocab as the default tiny model but independent weights
    (a badly aligned draft). The weight seed is offset so it never equals a target's
    small seed: ``write_unrelated(p, 0)`` is unrelated to ``write_tiny_llama(q, seed=0)``."""
    return write_tiny_llama(path, seed=_UNRELATED_SEED_OFFSET + seed, **kwargs)
