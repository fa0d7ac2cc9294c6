"""Decode SmolLM2 one token at a time forever (a draft thread's work), in cgroup /sys/fs/cgroup/cpu/burn."""
import os, sys
from pathlib import Path
g = Path("/sys/fs/cgroup/cpu/burn"); g.mkdir(exist_ok=True)
(g / "cpu.cfs_period_us").write_text("10000"); (g / "cpu.cfs_quota_us").write_text(sys.argv[1])
(g / "cgroup.procs").write_text(str(os.getpid()))
import llama_cpp
m = llama_cpp.Llama(os.path.expanduser("~/.cache/pipeinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"), n_ctx=4096, n_threads=1, verbose=False)
while True:
    m.reset()
    m.eval([1, 2, 3])
    for i in range(2000):
        m.eval([100 + i % 50])
