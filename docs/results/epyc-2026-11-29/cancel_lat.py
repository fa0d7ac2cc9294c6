import json, sys
for name in sys.argv[1:]:
    recs=[json.loads(l) for l in open(f"/work/b66/r/{name}.trace")]
    cancel_t = {}
    for r in recs:
        if r.get("name") == "CancelRuns":
            for run in r["runs"]: cancel_t.setdefault(run, r["t"])
    for rank in (1, 2, 3):
        ab = sorted(round(1000*(s["end"]-cancel_t[s["run"]])) for s in recs if s.get("type")=="span" and s["rank"]==rank and s["run"] in cancel_t and s["outcome"]=="aborted")
        st = sorted(round(1000*(s["start"]-cancel_t[s["run"]])) for s in recs if s.get("type")=="span" and s["rank"]==rank and s["run"] in cancel_t and s["outcome"]=="computed" and s["start"] > cancel_t[s["run"]])
        print(name, "rank", rank, "aborted at +ms", ab, "| computed, started after cancel +ms", st)
