import json, sys, numpy as np, llama_cpp
from pipeinfer.model.models import resolve_model
recs = [json.loads(l) for l in open("/work/b66/r/it.trace")]
answer = [t for r in recs if r.get("name") == "EmitTokens" for t in r["tokens"]]
from experiments.bench_peers import render_prompt
for name in ("qwen-coder-0.5b", "/work/b66/first8.gguf"):
    path = str(resolve_model(name)) if not name.startswith("/") else name
    m = llama_cpp.Llama(path, n_ctx=1024, logits_all=True, verbose=False, n_threads=1)
    prompt = m.tokenize(render_prompt("qwen-coder", "Write a Python LRU cache class with type hints and a usage example.").encode(), add_bos=False, special=True)
    toks = prompt + answer
    m.eval(toks)
    L = np.array(m.scores[len(prompt) - 1:len(toks) - 1])
    z = L - L.max(1, keepdims=True); p = np.exp(z); p /= p.sum(1, keepdims=True)
    top, arg = p.max(1), p.argmax(1)
    right = arg == np.array(answer)
    for thr in (0.0, 0.3, 0.5):
        c = top >= thr
        print(name, f"thr {thr}: confident {c.mean():.2f}, right|confident {right[c].mean():.2f}")
