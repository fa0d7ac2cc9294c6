cd /work/main
P="Write a Python LRU cache class with type hints and a usage example."
.venv/bin/python experiments/bench_peers.py --nodes 4 -n 128 -k 3 --systems iterative,pipeinfer \
  --variant "iterative-9-9-10=--strategy iterative --layer-split 0,0.32142857,0.32142857,0.35714286" \
  --variant "pipeinfer-9-9-10=--strategy pipeinfer --layer-split 0,0.32142857,0.32142857,0.35714286" \
  --prompt "$P" --out /work/b60/lru_split.csv
