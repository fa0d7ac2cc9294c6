"""CPU seconds of every rank of a pipeinfer job, its busiest threads apart, from
/proc/PID/task/*/stat, sampled every 0.5 s for SECONDS (run it beside one job, started just
before it): `python rank_threads.py 55 & NODES=8 ... run`. Ranks are known by PMI_RANK.
(validate-2026-11-25b/sample_head_threads.py does the same for the head only, per second.)"""
import os, time, sys, glob
seen, ranks = {}, {}
t_end = time.time() + float(sys.argv[1])
tck = os.sysconf('SC_CLK_TCK')
while time.time() < t_end:
    for task in glob.glob('/proc/[0-9]*/task/[0-9]*'):
        pid, tid = task.split('/')[2], task.split('/')[4]
        try:
            if pid not in ranks:
                env = open(f'/proc/{pid}/environ', 'rb').read().split(b'\0')
                r = [e.split(b'=', 1)[1].decode() for e in env if e.startswith(b'PMI_RANK=')]
                ranks[pid] = r[0] if r else None
            if ranks[pid] is None: continue
            st = open(task + '/stat').read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        seen[(pid, tid)] = (int(st[11]) + int(st[12])) / tck
    time.sleep(0.5)
tot = {}
for (pid, tid), cpu in seen.items():
    tot.setdefault(ranks[pid], []).append((cpu, tid))
for r in sorted(tot, key=int):
    ths = sorted(tot[r], reverse=True)
    print('rank', r, 'total', round(sum(c for c, _ in ths), 2), 'top threads', [round(c, 2) for c, _ in ths[:4]])
