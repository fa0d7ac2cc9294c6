# At-once conversation TTFT before (33ce57a: a request cancels the refill) and after (HEAD:
# the next turn takes its slot behind the refill), llama-server over RPC beside, one script.
cd /work/main
B=$(.venv/bin/python -m experiments.harness.build_peers --where)
M=~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
bench() { $B/llama-bench -m $M -t 1 -p 0 -n 32 -r 3 2>/dev/null | grep tg32; }
echo "== $(git log --oneline -1)"
echo "== llama-bench before"; bench
echo "== before: 33ce57a (pipeinfer/ checked out from it), at once"
git checkout -q 33ce57a -- pipeinfer && git log --oneline -1 33ce57a
.venv/bin/python experiments/bench_turns.py -k 3 --scenario turns --systems pipeinfer
git checkout -q HEAD -- pipeinfer && git status --short
echo "== llama-bench between"; bench
echo "== after: HEAD, at once"
.venv/bin/python experiments/bench_turns.py -k 3 --scenario turns --systems pipeinfer,llama-server
echo "== llama-bench after"; bench
