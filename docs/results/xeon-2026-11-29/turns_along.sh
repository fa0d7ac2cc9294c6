# As run: the working tree then made the refill along the default, so "pipeinfer" below is
# `--refill-along` and "pipeinfer-idle-refill" `--no-refill-along`, today's default (named
# pipeinfer-refill-along and pipeinfer-idle-refill in bench_serve now).
# Conversation TTFT asked at once and after a pause: the refill along the generation (default)
# against the idle refill (--no-refill-along) and llama-server over RPC; every run under the
# CPU lock (one bench at a time).
cd /work/main
B=$(.venv/bin/python -m experiments.harness.build_peers --where)
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
bench() { $B/llama-bench -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32; }
echo "== llama-bench before"; flock /tmp/cpu.lock bash -c "$(declare -f bench); B=$B M=$M bench"
echo "== turns, at once"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_turns.py -k 3 --scenario turns --systems pipeinfer,pipeinfer-idle-refill,llama-server
echo "== turns, pause 5 s"
flock /tmp/cpu.lock .venv/bin/python experiments/bench_turns.py -k 3 --scenario turns --think 5 --systems pipeinfer,pipeinfer-idle-refill,llama-server
echo "== llama-bench after"; flock /tmp/cpu.lock bash -c "$(declare -f bench); B=$B M=$M bench"
