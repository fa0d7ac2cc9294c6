"""`pipeinfer serve --ranks N` under failures for a while: clients ask one answer after
another while a random rank of the job is SIGKILLed every 30-60 s; every answer must complete
and equal the undisturbed one. Prints the clients' tokens per second during the soak against
an undisturbed stretch of the same length before it (same server, same clients), the front's
memory growth from the soak's first minute to its end, and whether anything of the job
outlived the front's SIGTERM.

    flock /tmp/cpu.lock python experiments/bench_failover.py soak        # 10 minutes, Qwen
    python experiments/bench_failover.py soak --small --soak 120 --calm 60   # SmolLM2 here

Defaults: the failover benchmark's cluster (4 emulated nodes x 0.5 core on gigabit links,
Qwen2.5-Coder 1.5B + 0.5B with --strategy pipeinfer, 4 clients, 128-token coding answers);
--small: SmolLM2 on 3 ranks of this machine. Needs root for the cluster emulation.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path

from experiments.bench_failover import PROMPTS, Client, Front, front_arguments, small_server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench_failover.py soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--soak", type=float, default=600.0, help="seconds of kills")
    parser.add_argument("--calm", type=float, default=300.0,
                        help="seconds of the undisturbed stretch before it")
    parser.add_argument("--every", default="30,60", help="seconds between kills: MIN,MAX")
    parser.add_argument("--seed", type=int, default=49)
    front_arguments(parser, n=128)
    return parser


class Clients:
    """Clients asking one answer after another until told to stop; every answer's tokens,
    completion and exactness against `reference`."""

    def __init__(self, url: str, args, reference: dict[str, str]):
        self.url, self.args, self.reference = url, args, reference
        # per answer: its end, its chunks' arrival times, complete, exact, error
        self.results: list[tuple[float, list[float], bool, bool, object]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                         for i in range(args.clients)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(900)

    def _loop(self, i: int) -> None:
        k = i
        while not self._stop.is_set():
            prompt = PROMPTS[k % len(PROMPTS)]
            k += 1
            c = Client(self.url, prompt, self.args.n)
            c.run()
            self.results.append((time.monotonic(), [at for at, _ in c.chunks],
                                 c.done and c.error is None, c.text == self.reference[prompt],
                                 c.error))
            if c.error is not None:
                time.sleep(1.0)   # (an answer refused: no loop of refusals)

    def tokens_between(self, t0: float, t1: float) -> int:
        """Chunks that arrived in [t0, t1) (an answer is recorded when it ends: read this
        after stop(), which waits for the answers under way)."""
        return sum(t0 <= at < t1 for _, times, *_ in self.results for at in times)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmRSS:")))


def outliving(mark: str) -> list[int]:
    """Processes whose command line holds `mark` (the job's state directory)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if mark in open(f"/proc/{entry}/cmdline").read().replace("\0", " "):
                    found.append(int(entry))
            except OSError:
                pass
    return found


def soak(front: Front, args, clients: Clients, rng: random.Random) -> tuple[int, float]:
    """Kill a random rank every --every seconds for --soak seconds: (kills, the front's RSS
    growth in MB from the soak's first minute to its end)."""
    low, high = (float(x) for x in args.every.split(","))
    end, started = time.monotonic() + args.soak, time.monotonic()
    kills, rss0 = 0, None
    while time.monotonic() < end:
        time.sleep(min(rng.uniform(low, high), max(0.0, end - time.monotonic())))
        if rss0 is None and time.monotonic() - started >= 60:
            rss0 = rss_kb(front.proc.pid)
        status, body = front.health()
        ranks = [r["pid"] for r in body.get("ranks", [])] if status == 200 else []
        if ranks and time.monotonic() < end:
            os.kill(rng.choice(ranks), signal.SIGKILL)
            kills += 1
            print(f"  {time.monotonic() - started:6.1f} s: killed a rank ({kills})", flush=True)
    grown = (rss_kb(front.proc.pid) - rss0) / 1024 if rss0 is not None else float("nan")
    return kills, grown


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    small_server(args)
    state = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    (state / "down").mkdir()
    print(f"# bench_soak: {args.model}" + (f" + {args.draft} ({args.strategy})" if args.draft
          else "") + f", {args.nodes} " + ("ranks on this machine" if args.small else
          f"nodes x {args.cpu} core") + f", {args.clients} clients x {args.n} tokens; "
          f"{args.calm:.0f} s undisturbed, then {args.soak:.0f} s with a rank killed every "
          f"{args.every} s", flush=True)
    args.job_args += " --max-restarts 1000"   # (kills closer than a minute count in a row)
    front = Front(args, state, state / "front.log")
    try:
        front.wait_ready()
        reference = {}
        for prompt in PROMPTS:
            c = Client(front.url, prompt, args.n)
            c.run()
            reference[prompt] = c.text
        clients = Clients(front.url, args, reference)
        t0 = time.monotonic()
        clients.start()
        time.sleep(args.calm)
        t1 = time.monotonic()
        kills, grown = soak(front, args, clients, random.Random(args.seed))
        t2 = time.monotonic()
        clients.stop()
    finally:
        front.stop()
    time.sleep(2)
    left = outliving(str(state))
    calm = clients.tokens_between(t0, t1) / (t1 - t0)
    stormy = clients.tokens_between(t1, t2) / (t2 - t1)
    done = sum(r[2] for r in clients.results)
    exact = sum(r[2] and r[3] for r in clients.results)
    print(f"\nundisturbed {calm:.2f} tokens/s; with {kills} kills {stormy:.2f} tokens/s "
          f"= {stormy / calm:.2f}x")
    print(f"answers: {len(clients.results)}, complete {done}, exact {exact}; the front's "
          f"RSS grew {grown:.1f} MB from the soak's first minute; processes left after "
          f"SIGTERM: {len(left)}")
    print(f"# the front's log: {state}/front.log")
    return 0 if done == exact == len(clients.results) and not left else 1

