"""Pipeline stages through real llama.cpp: chained slices give logits bit-identical to the whole
model (prompt batches, single-token steps on the KV cache, several sequences in one batch,
seq_cp / seq_rm / seq_keep), and decodes cancel promptly without disturbing the cache."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from support import tinymodel
from pipeinfer.model.embedding import Embedder
from pipeinfer.model.llama_lib import LlamaError, dequantize_rows
from pipeinfer.model.partition import partition
from pipeinfer.model.slicing import model_info, read_model, split_model
from pipeinfer.model.stage import Stage, StageAborted, StageConfig

CFG = StageConfig(n_ctx=256, n_batch=64, n_seq_max=4, n_threads=1)

TINY_SPLITS = [[1.0], [0.5, 0.5], [0.25, 0.25, 0.5], [0.25, 0.25, 0.25, 0.25],
               [0.0, 0.5, 0.5], [0.0, 0.25, 0.25, 0.5]]
SMOL_SPLITS = [[1.0], [0.5, 0.5], [0.2, 0.3, 0.5], [0.25, 0.25, 0.25, 0.25], [0.0, 0.3, 0.3, 0.4]]


def split_id(fractions) -> str:
    return "-".join(f"{f:g}" for f in fractions)


class Whole:
    """The unsliced model in one stage, fed token ids: the reference."""

    def __init__(self, path: Path, config: StageConfig = CFG):
        self.stages = [Stage(path, config, label="whole")]

    def decode(self, positions, seq_ids, tokens):
        return self.stages[0].decode(positions, seq_ids, tokens=tokens)

    def apply(self, op: str, *args):
        for s in self.stages:
            getattr(s, op)(*args)

    def pos_max(self, seq: int) -> int:
        values = {s.seq_pos_max(seq) for s in self.stages}
        assert len(values) == 1, f"stages disagree on seq {seq}: {values}"
        return values.pop()

    def close(self):
        for s in self.stages:
            s.close()


class Chain(Whole):
    """The model cut by `fractions`: the head computes embeddings (it owns no stage file when
    its fraction is 0), every stage is fed the previous one's activations."""

    def __init__(self, path: Path, fractions, out_dir: Path, config: StageConfig = CFG):
        n_layer = model_info(read_model(path), path).n_layer
        manifest = json.loads(split_model(path, partition(n_layer, fractions), out_dir).read_text())
        self.stages = [Stage(out_dir / e["file"], config, label=f"rank {e['rank']}")
                       for e in manifest["stages"] if e["file"]]
        assert [s.final for s in self.stages] == [False] * (len(self.stages) - 1) + [True]
        assert sum(s.n_layer for s in self.stages) == n_layer
        self.embed = Embedder(path)

    def decode(self, positions, seq_ids, tokens):
        x = self.embed(tokens)
        for stage in self.stages:
            x = stage.decode(positions, seq_ids, embd=x)
        return x


# --- scenarios: each returns every logits array it produced, in order ---------------------------

def sc_prompt_then_steps(m, toks):
    """A prompt batch, then 8 single-token steps that reuse the KV cache."""
    m.apply("clear")
    out = [m.decode(list(range(8)), [[0]] * 8, toks[:8])]
    for i in range(8):
        out.append(m.decode([8 + i], [[0]], [toks[8 + i]]))
    assert m.pos_max(0) == 15
    return out


def sc_two_sequences(m, toks):
    """One batch with tokens in seq 0, in seq 1 and in both; then one step in each."""
    m.apply("clear")
    a, b = toks[:4], toks[4:12]
    positions = [0, 1, 2, 3, 4, 4, 5, 5, 6]
    seq_ids = [[0, 1]] * 4 + [[0], [1], [0], [1], [1]]
    out = [m.decode(positions, seq_ids, a + b[:5])]
    assert (m.pos_max(0), m.pos_max(1)) == (5, 6)
    out.append(m.decode([6, 7], [[0], [1]], b[5:7]))
    assert (m.pos_max(0), m.pos_max(1)) == (6, 7)
    return out


def sc_copy_and_remove(m, toks):
    """Prefix in seq 0; seq_cp 0 -> 1; different tokens in each branch at the same position in
    one batch; seq_rm back to a shorter prefix in both and re-decode; seq_keep; continue."""
    m.apply("clear")
    out = [m.decode(list(range(6)), [[0]] * 6, toks[:6])]
    m.apply("seq_cp", 0, 1, -1, -1)
    assert (m.pos_max(0), m.pos_max(1)) == (5, 5)
    out.append(m.decode([6, 6], [[0], [1]], [toks[6], toks[7]]))
    out.append(m.decode([7, 7, 8], [[0], [1], [1]], [toks[8], toks[9], toks[10]]))
    assert (m.pos_max(0), m.pos_max(1)) == (7, 8)
    m.apply("seq_rm", 1, 7, -1)   # seq 1 keeps [0, 7)
    m.apply("seq_rm", 0, 5, -1)   # seq 0 keeps [0, 5)
    assert (m.pos_max(0), m.pos_max(1)) == (4, 6)
    out.append(m.decode([5, 6, 7], [[0], [0], [1]], [toks[11], toks[12], toks[13]]))
    assert (m.pos_max(0), m.pos_max(1)) == (6, 7)
    m.apply("seq_cp", 1, 2, 0, 7)  # a third branch from seq 1's first 7 positions
    out.append(m.decode([7], [[2]], [toks[14]]))
    m.apply("seq_keep", 0)
    assert (m.pos_max(0), m.pos_max(1), m.pos_max(2)) == (6, -1, -1)
    out.append(m.decode([7, 8], [[0], [0]], [toks[15], toks[0]]))
    assert m.pos_max(0) == 8
    return out


SCENARIOS = {"prompt_then_steps": sc_prompt_then_steps, "two_sequences": sc_two_sequences,
             "copy_and_remove": sc_copy_and_remove}


# --- fixtures -----------------------------------------------------------------------------------

@dataclass
class Setup:
    path: Path
    tokens: list[int]
    out_dir: Path
    whole: Whole | None = None
    chains: dict = field(default_factory=dict)
    references: dict = field(default_factory=dict)

    def reference(self, scenario: str):
        if scenario not in self.references:
            if self.whole is None:
                self.whole = Whole(self.path)
            self.references[scenario] = SCENARIOS[scenario](self.whole, self.tokens)
        return self.references[scenario]

    def chain(self, fractions) -> Chain:
        key = split_id(fractions)
        if key not in self.chains:
            self.chains[key] = Chain(self.path, fractions, self.out_dir / key)
        return self.chains[key]

    def close(self):
        for m in [self.whole, *self.chains.values()]:
            if m is not None:
                m.close()


@pytest.fixture(scope="module")
def tiny_setup(tiny_model: Path, tmp_path_factory):
    rng = np.random.default_rng(0)
    setup = Setup(tiny_model, [int(t) for t in rng.integers(0, 500, 16)],
                  tmp_path_factory.mktemp("tiny-chains"))
    yield setup
    setup.close()


@pytest.fixture(scope="module")
def smol_setup(smollm2: Path, tmp_path_factory):
    rng = np.random.default_rng(0)
    setup = Setup(smollm2, [int(t) for t in rng.integers(0, 49152, 16)],
                  tmp_path_factory.mktemp("smol-chains"))
    yield setup
    setup.close()


def assert_identical(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, (i, g.shape, w.shape)
        assert np.all(np.isfinite(g))
        diff = float(np.abs(g - w).max())
        assert diff == 0.0, f"decode {i}: max abs diff {diff}"


# --- exactness ----------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("fractions", TINY_SPLITS, ids=split_id)
def test_tiny_chain_equals_whole(tiny_setup: Setup, fractions, scenario):
    chain = tiny_setup.chain(fractions)
    assert len(chain.stages) == sum(1 for f in fractions if f > 0)
    assert_identical(SCENARIOS[scenario](chain, tiny_setup.tokens), tiny_setup.reference(scenario))


@pytest.mark.slow
@pytest.mark.smollm2
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("fractions", SMOL_SPLITS, ids=split_id)
def test_smollm2_chain_equals_whole(smol_setup: Setup, fractions, scenario):
    chain = smol_setup.chain(fractions)
    assert_identical(SCENARIOS[scenario](chain, smol_setup.tokens), smol_setup.reference(scenario))


def test_reference_logits_are_informative(tiny_setup: Setup):
    """Guard against a vacuous comparison: logits differ between positions and sequences."""
    ref = tiny_setup.reference("two_sequences")[0]
    assert ref.shape == (9, model_info(read_model(tiny_setup.path), "t").n_vocab)
    assert len({row.argmax() for row in ref}) > 2
    assert np.abs(ref[4] - ref[5]).max() > 0.1  # same position, different branch


def test_embeddings_equal_token_input(tiny_setup: Setup):
    with Stage(tiny_setup.path, CFG) as s:
        toks = tiny_setup.tokens[:8]
        a = s.decode(list(range(8)), [[0]] * 8, tokens=toks)
        s.clear()
        b = s.decode(list(range(8)), [[0]] * 8, embd=Embedder(tiny_setup.path)(toks))
        assert np.array_equal(a, b)


def test_the_embedder_refuses_token_ids_outside_the_vocabulary(tiny_setup: Setup):
    embed = Embedder(tiny_setup.path)
    assert embed([0, embed.n_vocab - 1]).shape == (2, embed.n_embd)
    for bad in ([embed.n_vocab], [3, -1]):
        with pytest.raises(ValueError, match="out of range"):
            embed(bad)


def test_kept_rows_are_the_rows_converted_afresh(smollm2: Path):
    """The rows the embedder keeps give the bits a fresh conversion gives, whatever mix of
    kept, new and repeated tokens a run holds, while it keeps no more than its bound; the
    array it returns is the caller's to change."""
    embed = Embedder(smollm2)
    embed.max_kept = 8
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(0, embed.n_vocab, 30)] + [5, 5, 7, 5, 9, 7]
    tokens += tokens[:12]
    for i in range(0, len(tokens), 3):
        run = tokens[i:i + 3]
        got = embed(run)
        fresh = dequantize_rows(embed._rows[np.asarray(run)], embed._type, embed.n_embd)
        assert got.dtype == np.float32 and np.array_equal(got, fresh), run
        assert len(embed._kept) <= 8
        got += 1.0
    assert np.array_equal(embed([5, 7]), dequantize_rows(embed._rows[[5, 7]], embed._type,
                                                          embed.n_embd))
    wide = list(range(100, 120))                           # more new tokens than it keeps
    assert np.array_equal(embed(wide), dequantize_rows(embed._rows[wide], embed._type,
                                                        embed.n_embd))
    assert len(embed._kept) <= 8


def test_logit_rows_subset(tiny_setup: Setup):
    chain = tiny_setup.chain([0.5, 0.5])
    full = sc_prompt_then_steps(chain, tiny_setup.tokens)[0]
    chain.apply("clear")
    x = chain.embed(tiny_setup.tokens[:8])
    x = chain.stages[0].decode(list(range(8)), [[0]] * 8, embd=x)
    rows = [False] * 7 + [True]
    last = chain.stages[1].decode(list(range(8)), [[0]] * 8, embd=x, logit_rows=rows)
    assert last.shape == (1, full.shape[1])
    assert np.array_equal(last[0], full[7])


# --- misuse ---------------------------------------------------------------------------------------

def test_decode_refusals(tiny_model: Path, tmp_path: Path):
    chain = Chain(tiny_model, [0.5, 0.5], tmp_path)
    head, last = chain.stages
    x = chain.embed([1, 2])
    with pytest.raises(ValueError, match="exactly one of embd or tokens"):
        head.decode([0, 1], [[0], [0]])
    with pytest.raises(ValueError, match="exactly one of embd or tokens"):
        head.decode([0, 1], [[0], [0]], embd=x, tokens=[1, 2])
    with pytest.raises(LlamaError, match=r"batch of 0 tokens \(allowed 1..64\)"):
        head.decode([], [], embd=x[:0])
    with pytest.raises(LlamaError, match=r"batch of 65 tokens \(allowed 1..64\)"):
        head.decode(list(range(65)), [[0]] * 65, embd=np.zeros((65, 64), np.float32))
    with pytest.raises(ValueError, match=r"activations of shape \(2, 32\), expected \(2, 64\)"):
        head.decode([0, 1], [[0], [0]], embd=x[:, :32])
    with pytest.raises(ValueError, match=r"token 1: 0 sequence ids \(1..4\)"):
        head.decode([0, 1], [[0], []], embd=x)
    # llama.cpp's own batch validation: positions must continue the cached sequence
    head.decode([0, 1], [[0], [0]], embd=x)
    with pytest.raises(LlamaError, match="llama_decode failed"):
        head.decode([5], [[0]], embd=x[:1])
    assert head.seq_pos_max(0) == 1
    chain.close()
    chain.close()  # twice is fine


# --- cancellation -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    """A tiny llama with larger dimensions: a 256-token decode takes a few hundred ms in about
    a hundred graph nodes, so a cancellation has something to interrupt."""
    d = tmp_path_factory.mktemp("wide")
    return tinymodel.write_tiny_llama(d / "wide.gguf", n_layer=6, n_embd=512, n_head=8,
                                      n_head_kv=4, n_ff=2048)


BIG = StageConfig(n_ctx=512, n_batch=256, n_seq_max=4, n_threads=1)


def _decode_in_thread(stage: Stage, positions, seq_ids, run_id: int, **inputs):
    result: dict = {}

    def target():
        try:
            result["value"] = stage.decode(positions, seq_ids, run_id=run_id, **inputs)
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            result["error"] = err
        result["t_end"] = time.perf_counter()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def _wait_for_compute(stage: Stage, polls_before: int, n: int = 3, timeout: float = 30) -> None:
    """Block until the decode has gone through a few graph nodes (it is computing)."""
    deadline = time.monotonic() + timeout
    while stage.abort_polls < polls_before + n:
        assert time.monotonic() < deadline, "decode never started"
        time.sleep(0.0005)


def check_cancel(stage: Stage, inputs_for, n_prefix: int, n_big: int) -> None:
    """Prefix, then a big batch: cancelled mid-decode it raises StageAborted soon after the
    cancel, leaves the cache as before, and decoding it again gives the uncancelled result."""
    prefix = list(range(n_prefix))
    big = list(range(n_prefix, n_prefix + n_big))
    one = [[0]] * n_big

    stage.clear()
    stage.decode(prefix, [[0]] * n_prefix, run_id=1, **inputs_for(0, n_prefix))
    polls, t0 = stage.abort_polls, time.perf_counter()
    want = stage.decode(big, one, run_id=2, **inputs_for(n_prefix, n_big))
    t_full = time.perf_counter() - t0
    polls_full = stage.abort_polls - polls  # about one per graph node

    stage.seq_rm(0, n_prefix, -1)
    assert stage.seq_pos_max(0) == n_prefix - 1
    base = stage.abort_polls
    thread, result = _decode_in_thread(stage, big, one, 3, **inputs_for(n_prefix, n_big))
    _wait_for_compute(stage, base)
    t_cancel = time.perf_counter()
    stage.cancel(3)
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert isinstance(result.get("error"), StageAborted), result
    latency = result["t_end"] - t_cancel
    print(f"cancel latency {latency * 1e3:.1f} ms, full decode {t_full * 1e3:.0f} ms, "
          f"{stage.abort_polls - base} of {polls_full} graph nodes")
    assert latency < max(0.2 * t_full, 0.02), (latency, t_full)
    assert stage.abort_polls - base < polls_full
    assert stage.seq_pos_max(0) == n_prefix - 1  # the cache is as before the decode

    got = stage.decode(big, one, run_id=4, **inputs_for(n_prefix, n_big))
    assert np.array_equal(got, want)
    assert stage.seq_pos_max(0) == n_prefix + n_big - 1


def test_cancel_mid_decode_final_stage(wide_model: Path):
    toks = [int(t) for t in np.random.default_rng(1).integers(0, 500, 300)]
    with Stage(wide_model, BIG) as stage:
        assert stage.final
        check_cancel(stage, lambda a, n: {"tokens": toks[a:a + n]}, 8, 256)


@pytest.mark.slow
def test_cancel_mid_decode_middle_stage(wide_model: Path, tmp_path: Path):
    """A non-final slice (activations in, activations out through the eval callback)."""
    m = json.loads(split_model(wide_model, partition(6, [0.0, 0.5, 0.5]), tmp_path).read_text())
    x = np.random.default_rng(2).standard_normal((300, 512)).astype(np.float32)
    with Stage(tmp_path / m["stages"][1]["file"], BIG) as stage:
        assert not stage.final and stage.n_layer == 3
        check_cancel(stage, lambda a, n: {"embd": x[a:a + n]}, 8, 256)


@pytest.mark.slow
@pytest.mark.smollm2
def test_cancel_mid_decode_smollm2(smollm2: Path):
    toks = [int(t) for t in np.random.default_rng(1).integers(0, 49152, 200)]
    cfg = StageConfig(n_ctx=512, n_batch=128, n_seq_max=4, n_threads=1)
    with Stage(smollm2, cfg) as stage:
        check_cancel(stage, lambda a, n: {"tokens": toks[a:a + n]}, 8, 128)


@pytest.mark.slow
def test_cancel_before_decode(wide_model: Path):
    toks = [int(t) for t in np.random.default_rng(1).integers(0, 500, 300)]
    with Stage(wide_model, BIG) as stage:
        stage.decode(list(range(8)), [[0]] * 8, tokens=toks[:8], run_id=1)
        t0 = time.perf_counter()
        want = stage.decode(list(range(8, 264)), [[0]] * 256, tokens=toks[8:264], run_id=2)
        t_full = time.perf_counter() - t0
        stage.seq_rm(0, 8, -1)

        stage.cancel(7)  # run 7 has not started: its decode aborts at once
        polls = stage.abort_polls
        t0 = time.perf_counter()
        with pytest.raises(StageAborted):
            stage.decode(list(range(8, 264)), [[0]] * 256, tokens=toks[8:264], run_id=7)
        assert time.perf_counter() - t0 < max(0.2 * t_full, 0.02)
        assert stage.abort_polls - polls <= 2
        assert stage.seq_pos_max(0) == 7

        # a cancellation names one run: others decode normally, also while it is pending
        stage.cancel(8)
        got = stage.decode(list(range(8, 264)), [[0]] * 256, tokens=toks[8:264], run_id=9)
        assert np.array_equal(got, want)
        stage.seq_rm(0, 8, -1)

        base = stage.abort_polls
        thread, result = _decode_in_thread(stage, list(range(8, 264)), [[0]] * 256, 10,
                                           tokens=toks[8:264])
        _wait_for_compute(stage, base)
        stage.cancel(11)  # not the run being decoded
        thread.join(timeout=60)
        assert "error" not in result, result
        assert np.array_equal(result["value"], want)
        assert stage.seq_pos_max(0) == 263


def test_slots_are_contexts_of_their_own(tiny_setup: Setup):
    """Two slots of one stage (one model): the same tokens give the same logits in each, and
    one slot's KV cells (here: cleared, then refilled with another prompt) leave the other's
    alone, so a request computes in its slot exactly as alone in a stage of its own."""
    config = StageConfig(n_ctx=256, n_batch=64, n_seq_max=4, n_threads=1, n_slots=2)
    with Stage(tiny_setup.path, config, label="slots") as stage, \
            Stage(tiny_setup.path, CFG, label="alone") as alone:
        assert stage.n_slots == 2
        prompt = [1, 5, 9, 2, 7]
        rows = [(0,)] * len(prompt)
        a = stage.decode(range(5), rows, tokens=prompt, slot=0)
        b = stage.decode(range(5), rows, tokens=prompt[::-1], slot=1)
        stage.clear(slot=1)
        stage.decode(range(3), [(0,)] * 3, tokens=[3, 3, 3], slot=1)
        assert stage.seq_pos_max(0, slot=0) == 4 and stage.seq_pos_max(0, slot=1) == 2
        step = stage.decode([5], [(0,)], tokens=[4], slot=0)
        want = alone.decode(range(5), rows, tokens=prompt)
        np.testing.assert_array_equal(a, want)
        np.testing.assert_array_equal(step, alone.decode([5], [(0,)], tokens=[4]))
        assert not np.array_equal(a, b)
        view = stage.slot(1)
        view.seq_rm(0, 1, -1)
        assert stage.seq_pos_max(0, slot=1) == 0 and stage.seq_pos_max(0, slot=0) == 5
        with pytest.raises(IndexError):
            stage.slot(2)


# --- compaction (a serving slot's kept cells, engine/head/prompt_cache.py) --------------------------

def _turns(stage: Stage, toks: list[int], holes: bool, compact: bool) -> list[np.ndarray]:
    """A prompt, then one-token steps (with `holes`: each after a step of another sequence at
    the same position, whose cells are dropped afterwards, as rejected drafts' are), then a
    second turn's batch after the kept cells; compacted first if `compact`."""
    stage.clear()
    out = [stage.decode(list(range(8)), [[0]] * 8, tokens=toks[:8])]
    for p in range(8, 16):
        if holes:
            stage.decode([p], [[1]], tokens=[toks[(p * 7) % len(toks)]])
        out.append(stage.decode([p], [[0]], tokens=[toks[p]]))
    stage.seq_keep(0)
    if compact:
        stage.seq_compact(0)
    assert stage.seq_pos_max(0) == 15
    out.append(stage.decode(list(range(16, 56)), [[0]] * 40, tokens=(toks * 4)[16:56]))
    return out


@pytest.mark.slow
@pytest.mark.smollm2
def test_compaction_puts_kept_cells_where_a_fresh_cache_has_them(smol_setup: Setup):
    """Cells of sequence 0 with holes between them (dropped sequences), compacted: a following
    batch (40 tokens: the tiled attention kernel, which groups cells in tiles) gives the logits
    of a cache that never had the holes, bit for bit."""
    config = StageConfig(n_ctx=256, n_batch=64, n_seq_max=4, n_threads=1)
    with Stage(smol_setup.path, config) as stage:
        want = _turns(stage, smol_setup.tokens, holes=False, compact=False)
        got = _turns(stage, smol_setup.tokens, holes=True, compact=True)
        assert_identical(got, want)
        again = _turns(stage, smol_setup.tokens, holes=False, compact=True)
        assert_identical(again, want)      # (nothing to move: unchanged)
        stage.clear()
        stage.seq_compact(0)               # an empty sequence: nothing happens
        assert stage.seq_pos_max(0) == -1
        loose = _turns(stage, smol_setup.tokens, holes=True, compact=False)
        print("without compaction: max abs diff",
              float(np.abs(loose[-1] - want[-1]).max()))
