"""Does a batch's output depend on foreign cells lying between its prefix and its own cells
in the KV cache? Usage: python interleave.py MODEL.gguf N
A: prefix [0,128) in two 64-token batches, then a batch of N tokens [128, 128+N), then a
   16-token run after it.
B: the same prefix, then 20 decode cells of sequence 1 and 2-token runs of sequence 2 at
   positions 128.. (cells 128..), then the N-token batch in sequence 0 (its cells after
   them); the foreign sequences removed and sequence 0 compacted; then the 16-token run.
Compares the batch's last-row logits and the run's logits bit for bit."""
import sys
import numpy as np
from pipeinfer.model.stage import Stage, StageConfig

path = sys.argv[1]
N = int(sys.argv[2])
toks = [(i * 7919) % 20000 + 100 for i in range(260)]


def run(stage, interleave):
    stage.clear()
    for s in (0, 64):
        stage.decode(list(range(s, s + 64)), [[0]] * 64, tokens=toks[s:s + 64],
                     logit_rows=[False] * 64)
    if interleave:
        stage.seq_cp(0, 1, 0, 128)
        stage.seq_cp(0, 2, 0, 128)
        for k in range(20):
            stage.decode([128 + k], [[1]], tokens=[toks[200 + k]])
            if k % 4 == 0:
                stage.decode([128 + k // 2, 129 + k // 2], [[2], [2]],
                             tokens=[toks[230 + k], toks[231 + k]])
    chunk = stage.decode(list(range(128, 128 + N)), [[0]] * N, tokens=toks[128:128 + N],
                         logit_rows=[False] * (N - 1) + [True])
    if interleave:
        stage.seq_rm(1)
        stage.seq_rm(2)
        stage.seq_compact(0)
    tail = stage.decode(list(range(128 + N, 144 + N)), [[0]] * 16, tokens=toks[128 + N:144 + N])
    return chunk.copy(), tail.copy()


with Stage(path, StageConfig(n_ctx=512, n_batch=256, n_seq_max=8)) as stage:
    a = run(stage, False)
    b = run(stage, True)
    a2 = run(stage, False)
print(path.split("/")[-1], "batch", N)
print("fresh twice equal:", np.array_equal(a[0], a2[0]) and np.array_equal(a[1], a2[1]))
print("chunk logits equal with foreign cells before it:", np.array_equal(a[0], b[0]),
      float(np.abs(a[0] - b[0]).max()))
print("later run equal after compaction:", np.array_equal(a[1], b[1]),
      float(np.abs(a[1] - b[1]).max()))
