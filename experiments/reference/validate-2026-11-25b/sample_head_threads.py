"""The head rank's CPU per thread during experiments/run_experiments.py runs (run it beside
them): for each run, the median per second of the main thread and of the other threads (the
draft thread) while drafting, from /proc/PID/task/*/stat. Wrote head-threads.txt."""
import os, sys, time, glob
from pathlib import Path
sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[3])]
from proc_stat import rank_of, thread_cpu as cpu
def find():
    cands=[]
    for p in glob.glob('/proc/[0-9]*'):
        pid=int(p.split('/')[-1])
        try: cmd=open(f'{p}/cmdline','rb').read()
        except Exception: continue
        if b'pipeinfer' in cmd and b' run' in cmd.replace(b'\0',b' ') and b'cluster.py' not in cmd and b'mpiexec' not in cmd:
            if rank_of(pid)==0: cands.append(pid)
    if cands:
        time.sleep(8)
        return max(cands, key=lambda p: len(os.listdir(f'/proc/{p}/task')) if os.path.exists(f'/proc/{p}') else 0)
import statistics
seen=set()
while True:
    pid=find()
    if pid is None or pid in seen: time.sleep(1); continue
    seen.add(pid)
    try: cmd=open(f'/proc/{pid}/cmdline','rb').read().split(b'\0')
    except Exception: continue
    label=[c for c in cmd if c.startswith(b'pair=')]
    label=label[0].decode().split(';',2)[-1] if label else '?'
    last=cpu(pid); rows=[]
    while os.path.exists(f'/proc/{pid}'):
        time.sleep(1); now=cpu(pid)
        d={tid:(n,v-last.get(tid,(n,0))[1]) for tid,(n,v) in now.items()}
        main=d.get(str(pid),('',0))[1]; other=sum(v for tid,(n,v) in d.items() if tid!=str(pid))
        rows.append((main,other)); last=now
    steady=[r for r in rows[2:-2] if r[1]>0.02] or rows[2:-2]
    if steady:
        print(label, 'main %.3f other %.3f n=%d'%(statistics.median(r[0] for r in steady), statistics.median(r[1] for r in steady), len(steady)), flush=True)
