import re, sys, statistics, collections
d = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    m = re.match(r"# (\S+) rep (\d+) .*?: ([\d.]+) t/s.*loop ([\d.]+) ms", line)
    if m:
        d[m[1]]["tps"].append(float(m[3])); d[m[1]]["loop"].append(float(m[4]))
for side, v in d.items():
    print(f"{side:8s} loop {' '.join(f'{x:.2f}' for x in v['loop'])} median {statistics.median(v['loop']):.2f} | t/s {' '.join(f'{x:.1f}' for x in v['tps'])} median {statistics.median(v['tps']):.1f}")
