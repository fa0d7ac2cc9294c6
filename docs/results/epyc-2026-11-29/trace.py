"""A traced pipeinfer run on the emulated cluster, as bench_peers runs it.
usage: SYSTEM=pipeinfer M=qwen-coder D=/work/b66/first8.gguf N=128 NODES=4 python trace.py NAME [flags]"""
import json, os, sys
from experiments.harness.bench_runs import RunSpec, pipeinfer_command
from experiments.harness.cluster_run import run_cluster
from experiments.bench_peers import render_prompt
name, flags = sys.argv[1], tuple(sys.argv[2:])
model = os.environ.get("M", "qwen-coder"); nodes = int(os.environ.get("NODES", 4))
spec = RunSpec(system=os.environ.get("SYSTEM", "pipeinfer"), variant="x", nodes=nodes,
               cpu=2 / nodes, model=model, draft=os.environ.get("D", "qwen-coder-0.5b"),
               prompt=render_prompt(model, "Write a Python LRU cache class with type hints and a usage example."),
               n=int(os.environ.get("N", 128)), link=os.environ.get("LINK", "none"),
               flags=flags + ("--trace", f"/work/b66/r/{name}.trace", "-v"))
code, out, err = run_cluster(pipeinfer_command(spec), 900)
open(f"/work/b66/r/{name}.err", "w").write(err)
r = json.loads(out.strip().splitlines()[-1])
print(name, {k: r.get(k) for k in ("speed_tps", "ttft_s", "accept_rate", "n_drafted", "n_accepted",
                                    "head_loop_cpu_ms_per_token", "draft_cpu_ms_per_token")})
