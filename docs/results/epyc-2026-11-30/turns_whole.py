"""Per system: median over reps and turns 2-6 of a turn's whole time (TTFT + its answer's
tokens / its decode t/s), and the medians of TTFT and decode."""
import re, sys, statistics, collections
d = collections.defaultdict(list)
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r"# turns rep \d+ (\S+): TTFT ([\d. ]+) s;.*tokens ([\d ]+); decode t/s ([\d. ]+)", line)
        if not m: continue
        ttft = [float(x) for x in m[2].split()]; toks = [int(x) for x in m[3].split()]
        tps = [float(x) for x in m[4].split()]
        d[m[1]].append([t + n / s for t, n, s in zip(ttft[1:], toks[1:], tps[1:])])
for sysname, reps in d.items():
    flat = [x for r in reps for x in r]
    print(f"{sysname:24s} turns 2-6 whole time median {statistics.median(flat):.2f} s  (sum per rep {' '.join(f'{sum(r):.1f}' for r in reps)})")
