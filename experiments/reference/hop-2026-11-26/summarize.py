import csv, statistics, sys
from collections import defaultdict
d = defaultdict(list)
for name in sys.argv[1:]:
    tag = name.rsplit("/", 1)[-1].removesuffix(".csv").rstrip("0123456789")  # base2 -> base
    for row in csv.DictReader(open(name)):
        if row["speed_tps"]:
            d[(int(row["ranks"]), tag, row["strategy"])].append(float(row["speed_tps"]))
med = {k: statistics.median(v) for k, v in d.items()}
for k in sorted(d):
    print(f"{k[0]} nodes  {k[1]:8} {k[2]:10} median {med[k]:5.2f} t/s  runs {' '.join(f'{x:.2f}' for x in d[k])}")
for n in sorted({k[0] for k in d}):
    rpc = [v for k, v in med.items() if k[0] == n and k[2] == "llama-rpc"]
    if not rpc:
        continue
    for tag in ("base", "branch"):
        it = med.get((n, tag, "iterative"))
        if it:
            print(f"{n} nodes  {tag:8} iterative / llama-rpc: {it / rpc[0]:.2f}x")
    b, a = med.get((n, "base", "iterative")), med.get((n, "branch", "iterative"))
    if a and b:
        print(f"{n} nodes  iterative branch / base: {a / b:.2f}x")
    b, a = med.get((n, "base", "pipeinfer")), med.get((n, "branch", "pipeinfer"))
    if a and b:
        print(f"{n} nodes  pipeinfer branch / base: {a / b:.2f}x")
