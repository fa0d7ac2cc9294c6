# Issue 47 prefill and issue 48 proxy, one script, every run under the exclusive CPU lock.
cd /work/main
B=$(.venv/bin/python -m experiments.harness.build_peers --where)
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
bench() { $B/llama-bench -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32; }
P="Write a Python LRU cache class with type hints and a usage example."
echo "== llama-bench before"; bench
echo "== prefill"
.venv/bin/python experiments/bench_peers.py --nodes 4 -k 3 --systems llama-rpc,iterative,pipeinfer \
  --variant "iterative-9-9-10=--strategy iterative --layer-split 0,0.32142857,0.32142857,0.35714286" \
  --variant "pipeinfer-9-9-10=--strategy pipeinfer --layer-split 0,0.32142857,0.32142857,0.35714286" \
  --prompt-tokens 1700 -n 16 --out /work/b60/prefill.csv
echo "== llama-bench between"; bench
echo "== proxy after (this tree)"
.venv/bin/python experiments/bench_peers.py --model smollm2 --draft smollm2 --nodes 4 -n 128 -k 3 \
  --systems iterative,pipeinfer --variant "pipeinfer-nocompact=--strategy pipeinfer --no-compact-draft" --prompt "$P" --out /work/b60/proxy_after.csv
echo "== proxy before (HEAD 782810a)"
PYTHONPATH=/work/b60/before .venv/bin/python experiments/bench_peers.py --model smollm2 --draft smollm2 --nodes 4 -n 128 -k 3 \
  --systems iterative,pipeinfer --variant "pipeinfer-nocompact=--strategy pipeinfer --no-compact-draft" --prompt "$P" --out /work/b60/proxy_before.csv
echo "== llama-bench after"; bench
