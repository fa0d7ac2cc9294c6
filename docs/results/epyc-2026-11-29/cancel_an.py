import json, sys, collections
for name in sys.argv[1:]:
    recs=[json.loads(l) for l in open(f"/work/b66/r/{name}.trace")]
    cancel_t = {}
    for r in recs:
        if r.get("name") == "CancelRuns":
            for run in r["runs"]:
                cancel_t.setdefault(run, r["t"])
    late = collections.defaultdict(float); n = collections.Counter(); waste = collections.defaultdict(float)
    for s in recs:
        if s.get("type") != "span" or s["run"] not in cancel_t: continue
        c = cancel_t[s["run"]]
        if s["outcome"] in ("computed", "aborted"):
            waste[s["rank"]] += s["end"] - s["start"]
            if s["end"] > c + 0.002:   # still computing after the cancel was issued
                late[s["rank"]] += s["end"] - max(s["start"], c); n[s["rank"]] += 1
    print(name, "cancelled runs", len(cancel_t), {r: f"waste {waste[r]:.2f}s, after-cancel {late[r]:.2f}s in {n[r]} spans" for r in sorted(waste)})
