"""experiments/harness/proc_stat.py, what the CPU-sampling scripts read of a job's ranks in /proc."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from experiments.harness.proc_stat import rank_of, thread_cpu

# A second thread spins for 0.3 s of CPU, then waits to be read.
CHILD = """
import threading, time
def spin():
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.3:
        pass
    print('spun', flush=True)
    time.sleep(30)
threading.Thread(target=spin).start()
"""


def test_a_rank_and_its_threads_cpu_are_read():
    env = {k: v for k, v in os.environ.items() if "RANK" not in k}
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                             env={**env, "PMI_RANK": "5", "PMI_SIZE": "8"})
    try:
        assert child.stdout.readline().strip() == "spun"
        time.sleep(0.05)
        assert rank_of(child.pid) == 5
        threads = thread_cpu(child.pid)
        main = threads.pop(str(child.pid))
        assert main[1] < 0.25 and len(threads) == 1, (main, threads)    # the main one waits
        name, cpu = threads.popitem()[1]
        assert name == main[0] and cpu >= 0.25
    finally:
        child.kill()
        child.wait()
    assert rank_of(child.pid) is None and thread_cpu(child.pid) == {}


def test_a_process_without_a_launcher_has_no_rank():
    child = subprocess.Popen(["sleep", "5"], env={"PATH": os.environ["PATH"]})
    try:
        assert rank_of(child.pid) is None
    finally:
        child.kill()
        child.wait()
