import time, os
def spin(cpu_s):
    t0 = time.thread_time(); w0 = time.perf_counter()
    while time.thread_time() - t0 < cpu_s: pass
    return time.perf_counter() - w0
res = []
for i in range(10):
    time.sleep(0.1)
    res.append(spin(0.015))
busy = [spin(0.015) for _ in range(10)]
print(f"after idle: wall for 15 ms CPU: median {sorted(res)[5]*1000:.1f} ms; back to back: {sorted(busy)[5]*1000:.1f} ms")
