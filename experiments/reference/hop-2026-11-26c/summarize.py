"""Medians per (nodes, variant, system) of bench.sh's CSVs and the ratios against llama.cpp RPC.
    python summarize.py rpc.csv udp.csv poll.csv"""
import csv
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)
for name in sys.argv[1:]:
    tag = name.rsplit("/", 1)[-1].removesuffix(".csv")  # rpc, udp (wake-ups over UDP), poll
    for row in csv.DictReader(open(name)):
        if row["speed_tps"]:
            runs[(int(row["ranks"]), tag, row["strategy"])].append(float(row["speed_tps"]))
med = {k: statistics.median(v) for k, v in runs.items()}
for k in sorted(runs):
    print(f"{k[0]} nodes  {k[1]:5} {k[2]:10} median {med[k]:5.2f} t/s  "
          f"runs {' '.join(f'{x:.2f}' for x in runs[k])}")
for n in sorted({k[0] for k in runs}):
    rpc = med.get((n, "rpc", "llama-rpc"))
    if not rpc:
        continue
    for tag in ("udp", "poll"):
        for system in ("iterative", "pipeinfer"):
            if (n, tag, system) in med:
                print(f"{n} nodes  {tag:5} {system} / llama-rpc: {med[(n, tag, system)] / rpc:.2f}x")
    udp, poll = med.get((n, "udp", "iterative")), med.get((n, "poll", "iterative"))
    if udp and poll:
        print(f"{n} nodes  iterative udp / poll: {udp / poll:.2f}x")
