"""Feasibility: one half-core node; a 1-token decode loop (A) with and without a background
64-token batch loop (B) on another context of the same model at SCHED_IDLE."""
import os, sys, threading, time, statistics
import llama_cpp
M = os.path.expanduser("~/.cache/pipeinfer/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
mode = sys.argv[1]
os.sched_setaffinity(0, {0})
def mk(n_batch):
    return llama_cpp.Llama(M, n_ctx=2048, n_batch=n_batch, n_threads=1, n_threads_batch=1, verbose=False)
a = mk(64)
b = mk(64) if mode != "alone" else None
stop = threading.Event()
done = [0]
def bg():
    if mode == "idle":
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    elif mode == "nice":
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    toks = list(range(1000, 1064))
    while not stop.is_set():
        b.reset(); b.eval(toks); done[0] += 1
if b is not None:
    t = threading.Thread(target=bg, daemon=True); t.start(); time.sleep(1.0)
a.eval([1, 2, 3])
lat = []; cpu=[]
for i in range(40):
    t0 = time.perf_counter(); c0=time.thread_time(); a.eval([100 + i]); lat.append(time.perf_counter() - t0); cpu.append(time.thread_time()-c0)
    time.sleep(0.06)   # the rest of the pipeline's turn
stop.set()
print(mode, "token ms median %.1f mean %.1f max %.1f" % (1e3*statistics.median(lat), 1e3*statistics.mean(lat), 1e3*max(lat)), "bg chunks", done[0], "cpu ms %.1f" % (1e3*statistics.median(cpu)), open("/proc/self/cgroup").read().strip()[-60:], flush=True)
