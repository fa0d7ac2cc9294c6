"""An embedding request's runs on the head (engine/head/embedding_job.py): inputs in runs of at
most `chunk` tokens from position 0, the slot cleared between inputs, each run asking the last
stage for hidden states (DecodeTx.states, carried on the wire); the states pooled and
normalized."""

from __future__ import annotations

import itertools

import numpy as np

from pipeinfer.engine.head.embedding_job import CLS, LAST, MEAN, EmbeddingJob, pool, pooling_of
from pipeinfer.schedule.events import Cancel, ResultArrived
from pipeinfer.engine.transport.wire import decode_header, decode_tx, encode_meta
from pipeinfer.schedule.transaction import DecodeTx, RunResult, seq_clear


class FakePipe:
    def __init__(self):
        self.sent = []

    def decode(self, tx, tokens):
        self.sent.append(("decode", tx, list(tokens)))

    def kv(self, ops):
        self.sent.append(("kv", ops))


def test_inputs_go_in_runs_and_come_back_pooled():
    pipe = FakePipe()
    job = EmbeddingJob(pipe, [[1, 2, 3, 4, 5], [6, 7]], itertools.count(10), 2, MEAN)
    job.begin()
    kinds = [s[0] for s in pipe.sent]
    assert kinds == ["decode", "decode", "decode", "kv", "decode"]
    assert pipe.sent[3][1] == [seq_clear()]
    txs = [s[1] for s in pipe.sent if s[0] == "decode"]
    assert [tx.positions for tx in txs] == [(0, 1), (2, 3), (4,), (0, 1)]
    assert all(tx.states and all(tx.logit_rows) and not tx.speculative for tx in txs)
    assert [tx.run_id for tx in txs] == [10, 11, 12, 13] and job.in_flight == 4
    rng = np.random.default_rng(0)
    states = {tx.run_id: rng.standard_normal((tx.n_tokens, 8)).astype(np.float32)
              for tx in txs}
    for run_id, rows in states.items():
        assert not job.finished
        job.feed(ResultArrived(run_id, RunResult(run_id, None, states=rows)))
    assert job.finished and job.in_flight == 0
    first, second = job.vectors()
    whole = np.concatenate([states[10], states[11], states[12]]).astype(np.float64).mean(0)
    assert np.allclose(first, whole / np.linalg.norm(whole))
    assert np.allclose(second, pool(states[13], MEAN))


def test_a_cancelled_job_ends_once_its_runs_are_back():
    job = EmbeddingJob(FakePipe(), [[1, 2, 3]], itertools.count(), 2, MEAN)
    job.begin()
    job.feed(Cancel())
    assert job.finished and job.cancelled and job.in_flight == 2
    job.feed(ResultArrived(0, RunResult(0, None)))   # (skipped or not: dropped)
    job.feed(ResultArrived(1, RunResult(1, None)))
    assert job.in_flight == 0


def test_pooling_types_and_normalization():
    states = np.array([[3.0, 4.0], [0.0, 2.0], [6.0, 8.0]], dtype=np.float32)
    assert np.allclose(pool(states, CLS), [0.6, 0.8])
    assert np.allclose(pool(states, LAST), [0.6, 0.8])
    assert np.allclose(pool(states, MEAN), np.array([3.0, 14 / 3]) / np.hypot(3.0, 14 / 3))
    assert pool(states, MEAN).dtype == np.float32
    assert [pooling_of(v) for v in (None, "0", "1", "2", "3", "4", "x")] == \
        [MEAN, MEAN, MEAN, CLS, LAST, MEAN, MEAN]


def test_the_states_flag_crosses_the_wire():
    tx = DecodeTx(7, (0, 1), ((0,), (0,)), (True, True), slot=2, states=True)
    meta = encode_meta(tx)
    assert decode_tx(decode_header(tx, meta_len=len(meta)), meta) == tx
    plain = DecodeTx(8, (0,), ((0,),), (True,))
    assert not decode_tx(decode_header(plain), encode_meta(plain)).states
    assert not RunResult(1, None, states=np.zeros((1, 2))).cancelled
