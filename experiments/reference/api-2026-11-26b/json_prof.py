"""JSON request on pipeinfer serve (4 x 0.5), per-rank and per-thread CPU over the request."""
# (fifth session: SPY attaches to the head process itself, not its cluster.py wrapper, and ends py-spy with SIGINT so it writes its file)
import os, sys, time, subprocess, glob
sys.path.insert(0, "/work/main/experiments")
import bench_turns as bt
from bench_serve import PipeinferServer
args = bt.parse_args(sys.argv[1:])
HZ = os.sysconf("SC_CLK_TCK")

def ranks(root):
    out = subprocess.run(["pgrep", "-f", "pipeinfer serve"], capture_output=True, text=True).stdout.split()
    pids = []
    for p in out:
        try:
            env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        r = [e for e in env if e.startswith(b"PMI_RANK=")]
        if r:
            pids.append((int(r[0].split(b"=")[1]), int(p)))
    return sorted(pids)

def cpu(pid):
    res = {}
    st = open(f"/proc/{pid}/stat").read(); f = st[st.rindex(")") + 2:].split()
    res[("proc", "total")] = (int(f[11]) + int(f[12])) / HZ
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            s = open(t + "/stat").read()
            comm = open(t + "/comm").read().strip()
        except OSError:
            continue
        f = s[s.rindex(")") + 2:].split()
        res[(t.rsplit("/", 1)[1], comm)] = (int(f[11]) + int(f[12])) / HZ
    return res

body = {"response_format": {"type": "json_schema", "json_schema": {"name": "languages", "schema": bt.SCHEMA}}}
os.environ["PIPEINFER_FREE_DRAFTS"] = os.environ.get("FREE", "1")
with PipeinferServer(args, args.json_system) as url:
    bt.chat(url, [{"role": "user", "content": "Say hi."}], 4, {})
    rs = ranks(None)
    before = {(r,p): cpu(p) for r, p in rs}
    spy = None
    if os.environ.get("SPY"):
        spy = subprocess.Popen(["/work/main/.venv/bin/py-spy", "record", "--native", "-r", "50", "-f", "raw", "-o", os.environ["SPY"], "-p", str(max(p for r, p in rs if r == 0))], stdout=open("/tmp/spy.out","w"), stderr=subprocess.STDOUT)
        time.sleep(1)
    a = bt.chat(url, [{"role": "user", "content": bt.JSON_ASK}], 256, body)
    after = {(r,p): cpu(p) for r, p in rs}
    if spy: spy.send_signal(2); spy.wait()
    m = bt.free_metrics(url)
print(f"FREE={os.environ['PIPEINFER_FREE_DRAFTS']} {a['tokens']} tokens in {a['wall']:.2f}s = {a['tokens']/a['wall']:.2f} t/s {m}")
for r, p in rs:
    rp = (r, p)
    tot = after[rp][('proc','total')] - before[rp][('proc','total')]
    print(f"rank {r} pid {p}: {tot:.2f} cpu-s ({tot/a['wall']:.2f} of a core), {len(after[rp])} threads")
    if r == 0:
        for k in after[rp]:
            d = after[rp][k] - before[rp].get(k, 0)
            if d > 0.05: print(f"   thread {k}: {d:.2f}")
