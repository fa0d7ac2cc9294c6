"""A pipeinfer run on the emulated cluster as bench_peers runs it; prints speed and each rank's stats.
usage: SYSTEM=pipeinfer-default-split python tr.py [flags]"""
import json, os, sys
from experiments.harness.bench_runs import RunSpec, pipeinfer_command
from experiments.harness.cluster_run import run_cluster
from experiments.bench_peers import render_prompt
flags = tuple(sys.argv[1:])
model = os.environ.get("M", "qwen-coder"); nodes = int(os.environ.get("NODES", 4))
spec = RunSpec(system=os.environ.get("SYSTEM", "pipeinfer"), variant="x", nodes=nodes,
               cpu=2 / nodes, model=model, draft=os.environ.get("D", "qwen-coder-0.5b"),
               prompt=render_prompt(model, "Write a Python LRU cache class with type hints and a usage example."),
               n=int(os.environ.get("N", 128)), link=os.environ.get("LINK", "none"), flags=flags)
code, out, err = run_cluster(pipeinfer_command(spec), 900)
r = json.loads(out.strip().splitlines()[-1])
print(os.environ.get("SYSTEM"), flags, {k: r.get(k) for k in ("speed_tps", "accept_rate", "head_loop_cpu_ms_per_token", "draft_cpu_ms_per_token", "head_cpu_ms_per_token")})
for s in r["rank_stats"]:
    print("   ", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items() if k in ("rank", "busy_s", "cpu_s", "busy_fraction", "wall_s", "peak_rss_mb", "n_runs", "runs")} )
print("   keys", list(r["rank_stats"][0].keys()))
