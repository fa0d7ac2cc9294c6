# Conversation TTFT with the prompt's tail in 16-token runs (default) against one batch
# (--prefill-tail 0) and llama-server over RPC, one run each, every run under the CPU lock.
cd /work/main
B=$(.venv/bin/python -m experiments.harness.build_peers --where)
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
bench() { $B/llama-bench -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32; }
echo "== llama-bench before"; bench
echo "== turns, pause 5 s"
.venv/bin/python experiments/bench_turns.py -k 3 --scenario turns --think 5 --systems pipeinfer,pipeinfer-one-tail,llama-server
echo "== llama-bench between"; bench
echo "== turns, at once"
.venv/bin/python experiments/bench_turns.py -k 3 --scenario turns --systems pipeinfer,pipeinfer-one-tail,llama-server
echo "== llama-bench after"; bench
