"""Constraint engines compared on speed per token over Qwen2.5's 151,936-token vocabulary:
llama.cpp's grammar sampler (what pipeinfer uses, model/grammar.py),
llguidance, xgrammar and outlines-core.

A fixed valid answer to bench_turns.py's JSON schema (a list of 5 objects of 4 fields) is
tokenized with the model's tokenizer (vocabulary only) and replayed token by token through
each engine. Measured per engine:
  compile   the schema (or GBNF) to a matcher, once (the vocabulary set-up apart: `vocab`);
  mask      the full allowed-token mask over all tokens, at each position;
  advance   past the answer's token, at each position;
  check     whether one candidate (the answer's token) is allowed: pipeinfer's greedy
            argmax check (llama.cpp: a 1-element llama_sampler_apply);
and checks that every engine allows every token of the answer and the end-of-generation
token after it, and reports the number of allowed tokens at a few positions.

Engines, each from its own JSON-schema compiler and, where it reads GBNF, from the very GBNF
pipeinfer gives llama.cpp (llama-cpp-python's json_schema_to_gbnf) so the languages match:
  llama.cpp       llama_sampler_init_grammar / _apply / _accept (the GBNF)
  llguidance      LLMatcher on lltokenizer_from_vocab; json schema, and the GBNF via gbnf_to_lark
  xgrammar        GrammarMatcher on a TokenizerInfo of the token pieces; json schema, the GBNF
  outlines-core   Guide on an Index of build_regex_from_schema's regex

xgrammar 0.2.8 imports torch (and transformers) at import time although its CPU mask needs
neither (the bitmask is any DLPack int32 array: numpy here); install it with --no-deps and
this script puts stand-in modules for them in sys.modules, before importing it, so no torch
code is on any measured path.

Run under `flock /tmp/cpu.lock`, one engine or a few per invocation (--engines) to keep each
locked run short. Single-threaded: RAYON_NUM_THREADS=1 and OMP_NUM_THREADS=1 are set before
the engines load, xgrammar's compiler gets max_threads=1.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time
import types
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import llama_cpp  # noqa: E402

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.harness.json_task import ANSWER, SCHEMA  # noqa: E402

MODEL = Path.home() / ".cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
ENGINES = ("llama.cpp", "llguidance-json", "llguidance-gbnf", "xgrammar-json", "xgrammar-gbnf",
           "outlines-core")
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


# ---------------------------------------------------------------- the vocabulary
class Vocab:
    """llama.cpp's vocabulary of the model (vocab_only), its pieces, the answer's tokens."""

    def __init__(self, path: Path):
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            sys.exit(f"cannot load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.eos = llama_cpp.llama_vocab_eos(self.vocab)
        self._pieces: list[bytes] | None = None

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, False)
        return list(buf[:n])

    def is_control(self, token: int) -> bool:
        return bool(llama_cpp.llama_token_get_attr(self.vocab, token)
                    & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL)

    def pieces(self) -> list[bytes]:
        """Each token's bytes (token_to_piece, special tokens as their text)."""
        if self._pieces is None:
            buf = ctypes.create_string_buffer(1024)
            out = []
            for t in range(self.n):
                k = llama_cpp.llama_token_to_piece(self.vocab, t, buf, 1024, 0, True)
                out.append(bytes(buf[:k]))
            self._pieces = out
        return self._pieces


def bits_to_bool(bitmask: np.ndarray, n: int) -> np.ndarray:
    """A 32-bit-word bitmask (token i: bit i % 32 of word i // 32) as n booleans."""
    return np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:n].astype(bool)


# ---------------------------------------------------------------- the engines
# Each engine, built from (Vocab, GBNF or None): setup_s (the vocabulary's set-up, s),
# compile_s (the grammar to a matcher, s), fresh() (a copy of the start state); a state's
# mask() -> (s, bool per token), advance(t) -> (s, ok), check(t) -> (s, allowed), where only
# the engine's own call is timed.

class LlamaCpp:
    def __init__(self, v: Vocab, gbnf: str):
        t0 = time.perf_counter()
        self.smpl = llama_cpp.llama_sampler_init_grammar(v.vocab, gbnf.encode(), b"root")
        self.compile_s = time.perf_counter() - t0
        self.setup_s = 0.0
        self.v = v
        self.data = np.zeros(v.n, TOKEN_DATA)
        self.data["id"] = np.arange(v.n, dtype=np.int32)
        self.one = np.zeros(1, TOKEN_DATA)
        self._arr = self._array(self.data)
        self._arr1 = self._array(self.one)

    @staticmethod
    def _array(data):
        return llama_cpp.llama_token_data_array(
            data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), len(data), -1,
            False)

    def fresh(self):
        s = object.__new__(LlamaCpp)
        s.__dict__.update(self.__dict__)
        s.smpl = llama_cpp.llama_sampler_clone(self.smpl)
        return s

    def mask(self):
        self.data["logit"] = 0.0
        self._arr.size, self._arr.selected, self._arr.sorted = self.v.n, -1, False
        t0 = time.perf_counter()
        llama_cpp.llama_sampler_apply(self.smpl, ctypes.byref(self._arr))
        dt = time.perf_counter() - t0
        return dt, np.isfinite(self.data["logit"])

    def advance(self, t):
        t0 = time.perf_counter()
        llama_cpp.llama_sampler_accept(self.smpl, t)
        return time.perf_counter() - t0, True

    def check(self, t):
        self.one["id"], self.one["logit"] = t, 0.0
        self._arr1.size, self._arr1.selected, self._arr1.sorted = 1, -1, False
        t0 = time.perf_counter()
        llama_cpp.llama_sampler_apply(self.smpl, ctypes.byref(self._arr1))
        dt = time.perf_counter() - t0
        return dt, bool(np.isfinite(self.one["logit"][0]))


class LLGuidance:
    _tok_cache: dict = {}

    def __init__(self, v: Vocab, gbnf: str | None):
        import llguidance
        from llguidance.llamacpp import lltokenizer_from_vocab
        t0 = time.perf_counter()
        if "tok" not in self._tok_cache:
            self._tok_cache["tok"] = lltokenizer_from_vocab(v.vocab)
            self._tok_cache["s"] = time.perf_counter() - t0
        self.tok, self.setup_s = self._tok_cache["tok"], self._tok_cache["s"]
        t0 = time.perf_counter()
        if gbnf is None:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
        else:
            from llguidance.gbnf_to_lark import gbnf_to_lark
            grammar = llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(gbnf))
        self.m = llguidance.LLMatcher(self.tok, grammar, log_level=1)
        self.compile_s = time.perf_counter() - t0
        if self.m.is_error():
            raise RuntimeError(self.m.get_error())
        self.n, self.eos = v.n, v.eos
        self.bits = np.zeros((self.n + 31) // 32, np.int32)

    def fresh(self):
        s = object.__new__(LLGuidance)
        s.__dict__.update(self.__dict__)
        s.m = self.m.deep_copy()
        s.bits = np.zeros_like(self.bits)
        return s

    def mask(self):
        ptr, size = self.bits.ctypes.data, self.bits.nbytes
        t0 = time.perf_counter()
        self.m.unsafe_compute_mask_ptr(ptr, size)
        dt = time.perf_counter() - t0
        return dt, bits_to_bool(self.bits, self.n)

    def advance(self, t):
        t0 = time.perf_counter()
        ok = self.m.consume_token(t)
        return time.perf_counter() - t0, ok

    def check(self, t):
        t0 = time.perf_counter()
        ok = self.m.validate_tokens([t]) == 1
        dt = time.perf_counter() - t0
        # once the grammar is complete the matcher is stopped: validate_tokens then takes no
        # token, the end of generation included, which its mask alone allows
        return dt, ok or (self.m.is_stopped() and t == self.eos)


def _import_xgrammar():
    """xgrammar without torch / transformers (see the module's docstring)."""
    import tvm_ffi  # noqa: F401 (loaded before the stand-in: it must see no torch)

    class _Any:
        def __init__(self, *a, **k): pass
        def __call__(self, *a, **k): return _Any()
        def __getattr__(self, n): return _Any()
        def __getitem__(self, k): return _Any()
        def __bool__(self): return False

    if "torch" not in sys.modules:
        torch = types.ModuleType("torch")
        torch.Tensor = type("Tensor", (), {})
        torch.__getattr__ = lambda n: _Any()
        sys.modules["torch"] = torch
    if "transformers" not in sys.modules:
        tf = types.ModuleType("transformers")
        tf.__getattr__ = lambda n: type(n, (), {})   # classes named, never used here
        sys.modules["transformers"] = tf
    import xgrammar
    return xgrammar


class XGrammar:
    _info_cache: dict = {}

    def __init__(self, v: Vocab, gbnf: str | None):
        xgr = _import_xgrammar()
        t0 = time.perf_counter()
        if "info" not in self._info_cache:
            # control tokens as empty pieces: xgrammar then takes them as special (never text)
            pieces = [b"" if v.is_control(t) else p for t, p in enumerate(v.pieces())]
            info = xgr.TokenizerInfo(pieces, xgr.VocabType.RAW, vocab_size=v.n,
                                     stop_token_ids=[v.eos])
            self._info_cache.update(info=info, compiler=xgr.GrammarCompiler(
                info, max_threads=1, cache_enabled=False), s=time.perf_counter() - t0)
        self.setup_s = self._info_cache["s"]
        compiler = self._info_cache["compiler"]
        t0 = time.perf_counter()
        if gbnf is None:
            compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=True)
        else:
            compiled = compiler.compile_grammar(gbnf)
        self.m = xgr.GrammarMatcher(compiled)
        self.compile_s = time.perf_counter() - t0
        self.compiled, self.xgr, self.n = compiled, xgr, v.n
        self.bits = np.full((1, (self.n + 31) // 32), -1, np.int32)

    def fresh(self):
        s = object.__new__(XGrammar)
        s.__dict__.update(self.__dict__)
        s.m = self.xgr.GrammarMatcher(self.compiled)
        s.bits = np.full_like(self.bits, -1)
        return s

    def mask(self):
        t0 = time.perf_counter()
        self.m.fill_next_token_bitmask(self.bits, 0)
        dt = time.perf_counter() - t0
        return dt, bits_to_bool(self.bits[0], self.n)

    def advance(self, t):
        t0 = time.perf_counter()
        ok = self.m.accept_token(t)
        return time.perf_counter() - t0, ok

    def check(self, t):
        # no check call: accept it and roll back (a forbidden token leaves the state as is)
        t0 = time.perf_counter()
        ok = self.m.accept_token(t)
        if ok:
            self.m.rollback(1)
        return time.perf_counter() - t0, ok


class Outlines:
    def __init__(self, v: Vocab, gbnf: str | None):
        import outlines_core as oc
        from outlines_core.json_schema import build_regex_from_schema
        t0 = time.perf_counter()
        tokens: dict[bytes, list[int]] = {}
        for t, p in enumerate(v.pieces()):
            if t != v.eos and p and not v.is_control(t):
                tokens.setdefault(p, []).append(t)
        vocabulary = oc.Vocabulary(v.eos, tokens)
        self.setup_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        regex = build_regex_from_schema(json.dumps(SCHEMA))
        self.index = oc.Index(regex, vocabulary)
        self.g = oc.Guide(self.index)
        self.compile_s = time.perf_counter() - t0
        self.oc, self.n, self.eos = oc, v.n, v.eos
        self.bits = np.zeros((self.n + 31) // 32, np.int32)

    def fresh(self):
        s = object.__new__(Outlines)
        s.__dict__.update(self.__dict__)
        s.g = self.oc.Guide(self.index)
        s.bits = np.zeros_like(self.bits)
        return s

    def mask(self):
        ptr, size = self.bits.ctypes.data, self.bits.size
        t0 = time.perf_counter()
        self.g.write_mask_into(ptr, size, 4)
        dt = time.perf_counter() - t0
        return dt, bits_to_bool(self.bits, self.n)

    def advance(self, t):
        t0 = time.perf_counter()
        self.g.advance(t, return_tokens=False)
        return time.perf_counter() - t0, True

    def check(self, t):
        t0 = time.perf_counter()
        ok = self.g.accepts_tokens([t])
        dt = time.perf_counter() - t0
        # accepts_tokens takes no end of generation, even in a final state (its mask does)
        return dt, bool(ok) or (self.g.is_finished() and t == self.eos)


def make(name: str, v: Vocab, gbnf: str):
    if name == "llama.cpp":
        return LlamaCpp(v, gbnf)
    if name.startswith("llguidance"):
        return LLGuidance(v, gbnf if name.endswith("gbnf") else None)
    if name.startswith("xgrammar"):
        return XGrammar(v, gbnf if name.endswith("gbnf") else None)
    if name == "outlines-core":
        return Outlines(v, None)
    raise SystemExit(f"unknown engine {name}")


def version(name: str) -> str:
    from importlib.metadata import version as v
    dist = {"llama.cpp": "llama_cpp_python", "outlines-core": "outlines_core"}.get(
        name, name.split("-")[0])
    try:
        return v(dist)
    except Exception:  # noqa: BLE001
        return "?"


# ---------------------------------------------------------------- the replay
def q(values, p):
    return float(np.percentile(np.array(values) * 1e3, p))


def replay(engine, tokens, eos, k, count_at):
    """K replays of `tokens` then eos; per-position timings (s) and the allowed counts."""
    masks, advances, checks, firsts, errors, counts, totals = [], [], [], [], [], {}, []
    seq = tokens + [eos]
    for rep in range(k):
        s = engine.fresh()
        total = 0.0
        for i, t in enumerate(seq):
            dt_c, ok_c = s.check(t)
            dt_m, allowed = s.mask()
            total += dt_m
            if not allowed[t]:
                errors.append(f"rep {rep} pos {i}: mask forbids {t}")
            if not ok_c:
                errors.append(f"rep {rep} pos {i}: check forbids {t}")
            if rep == 0 and i in count_at:
                counts[i] = int(allowed.sum())
            masks.append(dt_m)
            checks.append(dt_c)
            if i == len(seq) - 1:
                break   # the end of generation: nothing to advance past
            dt_a, ok_a = s.advance(t)
            if not ok_a:
                errors.append(f"rep {rep} pos {i}: advance refused {t}")
            advances.append(dt_a)
            if rep == 0:
                firsts.append(dt_m)
        totals.append(total)
    return dict(mask=masks, advance=advances, check=checks, first=firsts, errors=errors,
                counts=counts, totals=totals)


def allowed_sets(engine, tokens, positions):
    """The allowed tokens at `positions` (a fresh replay, untimed)."""
    s, out = engine.fresh(), {}
    for i, t in enumerate(tokens + [None]):
        if i in positions:
            out[i] = np.flatnonzero(s.mask()[1])
        if i >= max(positions):
            break
        s.advance(t)
    return out


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Engines: " + ", ".join(ENGINES))
    ap.add_argument("--model", type=Path, default=MODEL, help="GGUF (its vocabulary only)")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help="comma-separated, from: " + ", ".join(ENGINES))
    ap.add_argument("-k", type=int, default=3, help="replays of the answer per engine")
    ap.add_argument("--positions", default="0,1,10,20,40,60,80,100,123",
                    help="positions (0 = before the first token) whose allowed counts print")
    ap.add_argument("--greedy-path", action="store_true",
                    help="instead of the engines: how often pipeinfer's greedy path needs the "
                         "full mask (llama.cpp's sampler; a greedy generation of at most -n "
                         "tokens of --model, which must then be the whole model)")
    ap.add_argument("-n", type=int, default=300, help="--greedy-path: most tokens generated")
    ap.add_argument("--diff", action="store_true",
                    help="also print which tokens llama.cpp and each engine disagree on, "
                         "at those positions")
    return ap.parse_args()


def main():
    args = parse_args()
    if args.greedy_path:
        from experiments.harness.constraints_greedy import run
        return run(args.n, args.model)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor())
    print(f"# host: {cpu}, {os.cpu_count()} cores; python {platform.python_version()}; "
          f"RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']} "
          f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    v = Vocab(args.model)
    tokens = v.tokenize(ANSWER)
    gbnf = __import__("llama_cpp.llama_grammar", fromlist=["x"]).json_schema_to_gbnf(
        json.dumps(SCHEMA))
    print(f"# model {args.model.name}: {v.n} tokens, eos {v.eos}; answer {len(ANSWER)} chars "
          f"= {len(tokens)} tokens + eos; {args.k} replays")
    count_at = [int(p) for p in args.positions.split(",") if int(p) <= len(tokens)]
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    rows, sets = measure(names, v, gbnf, tokens, args, count_at)
    print_table(rows)
    print_counts(rows, v, tokens, count_at)
    if args.diff and "llama.cpp" in sets:
        print_diff(sets, v, count_at)


def measure(names, v, gbnf, tokens, args, count_at):
    """Each engine set up and replayed: the rows (name, engine, results) and, with --diff,
    the allowed sets at `count_at`."""
    rows, sets = [], {}
    for name in names:
        t0 = time.perf_counter()
        try:
            engine = make(name, v, gbnf)
        except Exception as err:  # noqa: BLE001
            print(f"# {name}: failed to set up: {type(err).__name__}: {err}", flush=True)
            continue
        r = replay(engine, tokens, v.eos, args.k, count_at)
        if args.diff:
            sets[name] = allowed_sets(engine, tokens, set(count_at))
        rows.append((name, engine, r))
        errors = r["errors"]
        print(f"# {name} {version(name)}: vocab set-up {engine.setup_s:.2f} s, compile "
              f"{engine.compile_s * 1e3:.1f} ms; replays {time.perf_counter() - t0:.1f} s; "
              f"{'all answer tokens allowed' if not errors else 'ERRORS: ' + '; '.join(errors[:5])}",
              flush=True)
    return rows, sets


def print_table(rows) -> None:
    print()
    hdr = (f"{'engine':<16} {'version':<8} {'vocab s':>7} {'compile ms':>10} "
           f"{'mask med':>8} {'mask p90':>8} {'1st med':>8} {'answer ms':>9} "
           f"{'adv med':>8} {'adv p90':>8} {'check med':>9} {'check p90':>9} ok")
    print(hdr)
    print("-" * len(hdr))
    for name, e, r in rows:
        print(f"{name:<16} {version(name):<8} {e.setup_s:>7.2f} {e.compile_s * 1e3:>10.1f} "
              f"{q(r['mask'], 50):>8.3f} {q(r['mask'], 90):>8.3f} {q(r['first'], 50):>8.3f} "
              f"{statistics.median(r['totals']) * 1e3:>9.1f} "
              f"{q(r['advance'], 50):>8.4f} {q(r['advance'], 90):>8.4f} "
              f"{q(r['check'], 50):>9.4f} {q(r['check'], 90):>9.4f} "
              f"{'yes' if not r['errors'] else 'NO'}")
    print("(ms; mask/adv/check: median and p90 over all positions of all replays; 1st med: "
          "the first replay's masks only; answer ms: all masks of one replay, median of the "
          "replays; check: one candidate token)")


def print_counts(rows, v, tokens, count_at) -> None:
    print()
    print("allowed tokens at position (0 = the start; the last = after the whole answer: "
          "end of generation):")
    print(f"{'engine':<16} " + " ".join(f"{p:>7}" for p in count_at))
    for name, _, r in rows:
        print(f"{name:<16} " + " ".join(f"{r['counts'].get(p, -1):>7}" for p in count_at))
    print("next token of the answer at those positions: " + ", ".join(
        f"{p}:{(v.pieces()[([*tokens, v.eos])[p]]).decode(errors='replace')!r}"
        for p in count_at))


def token_kinds(v, pieces, ids) -> str:
    """How many of `ids` are control tokens, bytes never in UTF-8, control characters,
    tokens starting or ending with a space, or other."""
    out = dict.fromkeys(("special", "bad", "ctl", "space", "other"), 0)
    for i in ids:
        p = pieces[i]
        if v.is_control(int(i)):
            out["special"] += 1
        elif any(b >= 0xF5 for b in p):
            out["bad"] += 1
        elif any(b < 0x20 or b == 0x7F for b in p):
            out["ctl"] += 1
        elif p.strip() != p:
            out["space"] += 1
        else:
            out["other"] += 1
    return " ".join(f"{k} {n}" for k, n in out.items() if n)


def print_diff(sets, v, count_at) -> None:
    print("tokens allowed by only one of llama.cpp and the engine (kinds: special = "
          "llama.cpp's control tokens, bad = a byte never in UTF-8 (0xF5-0xFF), ctl = a "
          "control character (below 0x20, 0x7F: newline, tab, ...: JSON whitespace "
          "between values, not allowed unescaped inside a string), space = starts or ends "
          "with a space, other; up to 6 shown):")
    base, pieces = sets["llama.cpp"], v.pieces()

    def show(ids):
        return ", ".join(repr(pieces[i]) for i in ids[:6])

    for name, s in sets.items():
        if name == "llama.cpp":
            continue
        for p in count_at:
            if p not in s or p not in base:
                continue
            only_l, only_e = np.setdiff1d(base[p], s[p]), np.setdiff1d(s[p], base[p])
            if len(only_l) or len(only_e):
                print(f"  {name} pos {p}: llama.cpp only {len(only_l)} "
                      f"[{token_kinds(v, pieces, only_l)}] ({show(only_l)}); {name} only "
                      f"{len(only_e)} [{token_kinds(v, pieces, only_e)}] ({show(only_e)})")


if __name__ == "__main__":
    main()
