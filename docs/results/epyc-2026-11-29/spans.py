import json, sys, collections, statistics
for name in sys.argv[1:]:
    recs = [json.loads(l) for l in open(f"/work/b66/r/{name}.trace")]
    spans = [r for r in recs if r.get("type") == "span"]
    d = collections.defaultdict(list)
    for s in spans:
        if s["outcome"] == "computed":
            d[(s["rank"], s["n_tokens"])].append(1000 * (s["end"] - s["start"]))
    print("==", name, " rank,n_tokens: count median_ms")
    print("  ", "  ".join(f"r{r}n{n}:{len(v)}x{statistics.median(v):.1f}" for (r, n), v in sorted(d.items()) if len(v) > 2))
    outs = collections.Counter((s["rank"], s["outcome"]) for s in spans)
    print("  ", dict(outs))
