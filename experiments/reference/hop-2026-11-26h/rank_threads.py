"""CPU seconds of every rank of a pipeinfer job, its busiest threads apart, sampled every
0.5 s for SECONDS (run it beside one job, started just before it):
`python rank_threads.py 55 & NODES=8 ... run`. Ranks are known by their launcher's variables.
(validate-2026-11-25b/sample_head_threads.py follows the head only, per second.)"""
import glob, sys, time
from pathlib import Path
sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[3])]
from proc_stat import rank_of, thread_cpu

seen, ranks = {}, {}
t_end = time.time() + float(sys.argv[1])
while time.time() < t_end:
    for proc in glob.glob('/proc/[0-9]*'):
        pid = proc.rsplit('/', 1)[1]
        if pid not in ranks:
            ranks[pid] = rank_of(pid)
        if ranks[pid] is not None:
            seen.update({(pid, tid): cpu for tid, (_, cpu) in thread_cpu(pid).items()})
    time.sleep(0.5)
tot = {}
for (pid, tid), cpu in seen.items():
    tot.setdefault(ranks[pid], []).append((cpu, tid))
for r in sorted(tot):
    ths = sorted(tot[r], reverse=True)
    print('rank', r, 'total', round(sum(c for c, _ in ths), 2), 'top threads', [round(c, 2) for c, _ in ths[:4]])
