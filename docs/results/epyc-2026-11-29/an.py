"""Where a traced run's time goes: python an.py NAME"""
import json, sys, collections, statistics
recs = [json.loads(l) for l in open(f"/work/b66/r/{sys.argv[1]}.trace")]
ev = [r for r in recs if r.get("type") != "span"]
spans = [r for r in recs if r.get("type") == "span"]
t0 = min(r["t"] for r in ev)
emits = [(r["t"] - t0, len(r["tokens"]), r["run"]) for r in ev if r.get("name") == "EmitTokens"]
print(f"events {len(ev)} spans {len(spans)}; first emit {emits[0][0]:.3f}s last {emits[-1][0]:.3f}s tokens {sum(e[1] for e in emits)}")
n = 0
for r in ev:
    if r.get("type") == "policy" or r.get("name") in ("WarmDraft", "Finish"):
        print(f"  {r['t']-t0:7.3f} [{n:3d} tok] {r.get('name')} {r.get('value','')} {r.get('why','')}")
    if r.get("name") == "EmitTokens":
        n += len(r["tokens"])
starts = [r for r in ev if r.get("name") == "StartRun"]
spec = [r for r in starts if r["speculative"]]
print(f"runs {len(starts)} speculative {len(spec)} guessed tokens {sum(r['n_tokens'] for r in spec)}")
print("cancel actions", sum(1 for r in ev if r.get("name") == "CancelRuns"),
      "runs cancelled", sum(len(r["runs"]) for r in ev if r.get("name") == "CancelRuns"))
print("draft jobs", sum(1 for r in ev if r.get("name") == "StartDraft"))
by = collections.defaultdict(lambda: collections.Counter())
for s in spans:
    k = ("spec" if s["speculative"] else "plain") + ":" + s["outcome"]
    by[s["rank"]][k] += s["end"] - s["start"]
for rank in sorted(by):
    print(f"  rank {rank}: " + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(by[rank].items())))
gaps = [b[0] - a[0] for a, b in zip(emits, emits[1:])]
print(f"emit gap median {1000*statistics.median(gaps):.1f} ms; mean {1000*statistics.mean(gaps):.1f}")
