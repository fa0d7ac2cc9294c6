"""What caps the simulator's 8 x 0.25 pipeinfer once the draft is nearly free (the head at
4 cores, draft_bound.sh's last row): the runs in flight (--max-runs, default 6) and the
cutoff's rise per run (-pr, default 0.05), one at a time and together, and the modelled
polling sleeps of idle ranks (idle_sleep, on in `pipeinfer simulate`; `run`'s ranks are woken
when a message comes, issue 34); -n 128, the acceptance of the simulator's own probe. Deterministic: the modelled clock, this host's cached layer and
draft times."""
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from pipeinfer.cli.plan import _accept, _setup  # noqa: E402
from pipeinfer.plan.inputs import counts_for  # noqa: E402
from pipeinfer.plan.simulate import SimConfig, simulate  # noqa: E402
from pipeinfer.schedule.options import SpecOptions  # noqa: E402

for head in (0.25, 4.0):
    cpus = ",".join([str(head)] + ["0.25"] * 7)
    setup = _setup("qwen-coder-1.5b", "qwen-coder-0.5b", None, None, None, cpus, "none", None,
                   None, None, True)
    counts = counts_for(setup, "pipeinfer", None)
    rate = _accept(setup, "pipeinfer", None)
    for max_runs, p_recovery, sleep in ((6, 0.05, True), (10, 0.05, True), (6, 0.0, True),
                                        (10, 0.0, True), (14, 0.0, True), (6, 0.05, False)):
        spec = replace(SpecOptions(), max_runs=max_runs, p_recovery=p_recovery)
        r = simulate(setup.pipeline(), counts, SimConfig("pipeinfer", 128, accept_rate=rate,
                                                         spec=spec, idle_sleep=sleep))
        print(f"--cpus {cpus} --max-runs {max_runs} -pr {p_recovery} idle_sleep {sleep}: "
              f"{r.speed_tps:.2f} t/s, busy {[round(b, 1) for b in r.busy_s]} s")
