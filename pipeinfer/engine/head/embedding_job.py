"""An embedding request in a lane of its own (`POST /v1/embeddings`): its inputs through the
pipeline with the last stage returning each token's final hidden state instead of logits
(DecodeTx.states: llama.cpp's embeddings, the output norm applied), pooled on the head.

Each input is evaluated from position 0 in sequence 0 of the lane's slot, in chunks of at
most `chunk` tokens (every row is an output, and the last stage's contexts are sized for a
few rows of outputs: model/stage.MAX_OUTPUTS); the slot's cells are cleared between inputs. Every
run goes out at once, so the inputs pipeline through the stages. None is speculative, so none
is ever aborted: a cancelled request's runs come back and are dropped.

Pooling, as llama.cpp's pooling types: "mean" over the input's tokens, "cls" its first
token's, "last" its last token's; the vector is then L2-normalized (llama-server's default,
and what OpenAI's embeddings are).
"""

from __future__ import annotations

import numpy as np

from ...schedule.events import Cancel, ResultArrived
from .lane_job import LaneJob
from ...schedule.generation import CANONICAL_SEQ
from ...schedule.speculation import runs_of
from ...schedule.transaction import DecodeTx, seq_clear

MEAN, CLS, LAST = "mean", "cls", "last"
POOLINGS = {1: MEAN, 2: CLS, 3: LAST}    # llama.cpp's llama_pooling_type values
EMBEDDING = "embedding"                   # a lane's strategy name for these jobs


def pooling_of(value: str | None) -> str:
    """The pooling of a model whose GGUF says `{arch}.pooling_type` = `value`: its own if
    it is mean, cls or last, else (none, unspecified) mean."""
    try:
        return POOLINGS.get(int(value), MEAN) if value is not None else MEAN
    except ValueError:
        return MEAN


def pool(states: np.ndarray, pooling: str) -> np.ndarray:
    """One input's vector from its tokens' hidden states [n_tokens, n_embd], L2-normalized
    (in double, as llama.cpp's common_embd_normalize)."""
    if pooling == CLS:
        vector = states[0].astype(np.float64)
    elif pooling == LAST:
        vector = states[-1].astype(np.float64)
    else:
        vector = states.astype(np.float64).mean(axis=0)
    norm = float(np.sqrt(np.sum(vector * vector)))
    return (vector / norm if norm > 0 else vector).astype(np.float32)


class EmbeddingJob(LaneJob):
    """The runs of one embedding request, and their states as they come back, in a Lane
    where a generation's driver would be (lane_job.py)."""

    def __init__(self, pipe, inputs: list[list[int]], run_ids, chunk: int, pooling: str):
        super().__init__()
        self.pipe, self.inputs, self.pooling = pipe, inputs, pooling
        self._run_ids, self.chunk = run_ids, chunk
        self._rows: dict[int, np.ndarray] = {}   # run id -> its rows of states
        self._runs: list[list[int]] = []        # each input's run ids, in order
        self.in_flight = 0

    def begin(self) -> None:
        """Every input's runs out, the slot cleared before each input but the first."""
        for k, tokens in enumerate(self.inputs):
            if k:
                self.pipe.kv([seq_clear()])
            runs = []
            for span in runs_of(range(len(tokens)), self.chunk):
                n = len(span)
                tx = DecodeTx(next(self._run_ids), tuple(span), ((CANONICAL_SEQ,),) * n,
                              (True,) * n, states=True)
                self.pipe.decode(tx, tokens[span.start:span.stop])
                runs.append(tx.run_id)
            self._runs.append(runs)
            self.in_flight += len(runs)

    def feed(self, event) -> None:
        if isinstance(event, Cancel):
            self.cancelled = self.finished = True
        elif isinstance(event, ResultArrived):
            self.in_flight -= 1
            if event.result.states is not None:
                self._rows[event.run_id] = event.result.states
            self.finished = self.finished or self.in_flight == 0

    def vectors(self) -> list[np.ndarray]:
        """Each input's pooled, normalized vector (once every run is back)."""
        return [pool(np.concatenate([self._rows[r] for r in runs]), self.pooling)
                for runs in self._runs]
