#!/usr/bin/env python3
"""How long a failure interrupts `pipeinfer serve --ranks N`: clients streaming
answers, a worker killed (or a host lost) once every answer has --kill-at tokens; the time to
the first token after the kill, for every client, and its phases: detect (the kill until
/health says recovering), relaunch + reload (until a new job takes requests), rebuild (the
KV cache of the prompt and the tokens sent, until the last client's first new token). Every
answer is compared with the undisturbed one (taken first, on the same server).

    flock /tmp/cpu.lock python experiments/bench_failover.py --scenario worker,host,head-host -K 3
    ... --keep both     # also without kept KV cells (-rebuilt rows), interleaved
    python experiments/bench_failover.py soak --help   # ranks killed for 10 minutes
    python experiments/bench_failover.py --replot streams.csv     # the chart again

--out DIR also keeps every client's token arrival times (DIR/streams.csv: scenario, repeat,
client, seconds since the clients started; the kill as client -1) and draws the first
repeat's tokens per second per client across the kill (DIR/failover.png); --replot CSV draws
that chart again from such a file without running anything.

Defaults: 4 emulated nodes of half a core on gigabit links (experiments/cluster.py
--as-mpiexec), Qwen2.5-Coder 1.5B + 0.5B with --strategy pipeinfer, 4 clients streaming
256-token coding answers, the kill at 64 tokens. --small: SmolLM2 on 3 ranks of this machine
(plain mpiexec), as the tests' server. Needs root for the cluster emulation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.harness import CLUSTER, charts  # noqa: E402
from experiments.harness.cluster import FRONT_ADDRESS  # noqa: E402

PIPEINFER = Path(sys.executable).parent / "pipeinfer"
PROMPTS = ["Write a Python function that parses a CSV file of transactions and returns the "
           "total amount per category, sorted by amount.",
           "Write a Python class for an LRU cache with get and put in O(1).",
           "Write a Python function that checks whether a string of brackets is balanced.",
           "Write a Python script that counts the words in a text file and prints the ten "
           "most common ones."]
POLL_S = 0.05


class Client(threading.Thread):
    """One streamed chat completion: (arrival time, text) of every chunk."""

    def __init__(self, url: str, prompt: str, n: int):
        super().__init__(daemon=True)
        self.url, self.chunks, self.error, self.done = url, [], None, False
        self.body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n,
                     "temperature": 0, "stream": True}

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=self.body,
                              timeout=900) as r:
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: "):
                        obj = json.loads(line[6:])
                        if "error" in obj:
                            self.error = obj
                        elif obj.get("choices"):
                            delta = obj["choices"][0].get("delta", {})
                            self.chunks.append((time.monotonic(), delta.get("content") or ""))
        except Exception as err:  # noqa: BLE001 (reported)
            self.error = repr(err)

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.chunks)

    def first_after(self, t: float) -> float | None:
        return next((at for at, _ in self.chunks if at > t), None)


def _disks(args) -> str:
    root = getattr(args, "disk_root", None)
    return f"--disks private --disk-root {root} " if root else ""


class Front:
    def __init__(self, args, state: Path, log: Path, keep: bool = True,
                 private: bool = True):
        cmd = [str(PIPEINFER), "serve", "--ranks", str(args.nodes), "--port", "0",
               "-m", args.model, "--parallel", str(args.clients), "--no-cache-prompt",
               "-c", "2048", *args.job_args.split()]
        if args.draft:
            cmd += ["-md", args.draft, "--strategy", args.strategy]
        if not args.small:
            cmd += ["--hosts", ",".join(f"node{i}" for i in range(args.nodes)),
                    "--front-address", FRONT_ADDRESS, "--mpiexec",
                    f"{sys.executable} {CLUSTER} --cpu {args.cpu} --link gigabit "
                    f"--state {state} {_disks(args) if private else ''}--as-mpiexec"]
        self.log = log
        env = dict(os.environ, PIPEINFER_KEEP_CELLS="1" if keep else "0")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"),
                                     start_new_session=True, env=env)
        self.url = ""

    def health(self) -> tuple[int, dict]:
        try:
            r = httpx.get(self.url + "/health", timeout=2)
            return r.status_code, r.json()
        except (httpx.TransportError, ValueError):
            return 0, {}

    def wait_ready(self, after_job: int = 0, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"the front ended:\n{self.log.read_text()[-3000:]}")
            if not self.url:
                said = re.search(r"listening on (http://\S+)", self.log.read_text())
                self.url = said.group(1) if said else ""
            else:
                status, body = self.health()
                if status == 200 and body["job"] > after_job:
                    return body
            time.sleep(POLL_S)
        raise SystemExit(f"not ready in {timeout} s")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(40)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def run_clients(front: Front, args) -> list[Client]:
    clients = [Client(front.url, PROMPTS[i % len(PROMPTS)], args.n) for i in range(args.clients)]
    for c in clients:
        c.start()
    return clients


def disturbed(front: Front, args, scenario: str, state: Path) -> dict:
    before = front.wait_ready()
    t0 = time.monotonic()
    clients = run_clients(front, args)
    while any(len(c.chunks) < args.kill_at and c.is_alive() for c in clients):
        time.sleep(0.01)
    t_kill = time.monotonic()
    if scenario.startswith("worker"):
        os.kill(next(r["pid"] for r in before["ranks"] if r["rank"] == 1), signal.SIGKILL)
    else:   # host: a worker's node; head-host: node0, the head's (its channel to the front too)
        (state / "down" / f"node{0 if scenario.startswith('head') else args.nodes - 2}").touch()
    detect = None
    while True:
        if front.proc.poll() is not None:
            raise SystemExit(f"bench_failover: the front ended (its log: {front.log})")
        status, body = front.health()
        now = time.monotonic()
        if status != 200 and detect is None:
            detect = now
        if status == 200 and body.get("job", 0) > before["job"]:
            ready, ranks = now, len(body["ranks"])
            break
        time.sleep(POLL_S)
    for c in clients:
        c.join(1800)
    firsts = [c.first_after(t_kill) for c in clients]
    first = max(f for f in firsts if f is not None) if all(firsts) else float("nan")
    return {"clients": clients, "t0": t0, "t_kill": t_kill, "detect": (detect or ready) - t_kill,
            "relaunch": ready - (detect or ready), "rebuild": first - ready,
            "total": first - t_kill, "ranks_after": ranks}


def front_arguments(parser: argparse.ArgumentParser, n: int) -> None:
    """The options of the server a Front starts and of its clients (also the soak's)."""
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cpu", type=float, default=0.5)
    parser.add_argument("-m", "--model", default="qwen-coder-1.5b")
    parser.add_argument("-md", "--draft", default="qwen-coder-0.5b")
    parser.add_argument("--strategy", default="pipeinfer")
    parser.add_argument("-n", type=int, default=n)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--job-args", default="",
                        help="more options for pipeinfer serve, e.g. \"-v\" (its log, with "
                             "the front's, is kept in the run's directory, printed at the end)")
    parser.add_argument("--small", action="store_true",
                        help="SmolLM2, 3 ranks on this machine (the tests' server)")


def small_server(args) -> None:
    """--small: SmolLM2 alone on 3 ranks of this machine."""
    if args.small:
        args.model, args.draft, args.nodes = "smollm2", None, 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="worker,host",
                        help="a comma list of: worker (rank 1 killed), host (a worker's node "
                             "lost), head-host (the head's node lost: the next job's head "
                             "reaches the front from another node)")
    parser.add_argument("--keep", choices=("on", "off", "both"), default="on",
                        help="the ranks keep copies of their KV cells (the default), or not "
                        "(every request's context is evaluated again), or both, interleaved")
    parser.add_argument("--cost", action="store_true",
                        help="no failure: the clients' tokens per second with and without "
                        "kept KV cells, interleaved, K times (what keeping costs)")
    parser.add_argument("-K", type=int, default=3)
    front_arguments(parser, n=256)
    parser.add_argument("--kill-at", type=int, default=64)
    parser.add_argument("--fresh-disks", action="store_true",
                        help="every repeat on nodes with empty disks (the first loss of a "
                        "cluster: the slices of the split after it are on no node yet); by "
                        "default the disks are kept across the repeats")
    parser.add_argument("--out", type=Path, help="keep the token times (DIR/streams.csv) and "
                        "draw the first repeat's tokens per second (DIR/failover.png)")
    parser.add_argument("--replot", type=Path, metavar="CSV",
                        help="run nothing: draw the chart of a streams.csv again (beside it)")
    return parser


def main() -> int:
    if sys.argv[1:2] == ["soak"]:   # the 10-minute soak (experiments/harness/soak.py)
        from experiments.harness import soak
        return soak.main(sys.argv[2:])
    parser = _parser()
    args = parser.parse_args()
    if args.replot:
        return replot(args.replot)
    small_server(args)
    keeps = {"on": ("",), "off": ("-rebuilt",), "both": ("", "-rebuilt")}[args.keep]
    scenarios = [s + k for s in args.scenario.split(",") if s for k in keeps]
    if args.small and any("host" in s for s in scenarios):
        parser.error("--small runs on plain mpiexec: --scenario worker only")
    work = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    # every node but node 0 a disk of its own (a lost host's copies are gone with it), kept
    # across the runs so that slices travel to the nodes once
    args.disk_root = work / "disks"
    if args.cost:
        return keeping_cost(args, work)
    print(f"# bench_failover: {args.model}" + (f" + {args.draft} ({args.strategy})"
          if args.draft else "") + f", {args.nodes} " + ("ranks on this machine"
          if args.small else f"nodes x {args.cpu} core") + f", {args.clients} clients x "
          f"{args.n} tokens, kill at {args.kill_at}; K={args.K}", flush=True)
    rows = {s: [] for s in scenarios}
    reference, streams = None, []
    for k in range(args.K):
        for scenario in scenarios:
            state = work / f"{scenario}{k}"
            if args.fresh_disks:
                args.disk_root = work / f"disks-{scenario}{k}"
            (state / "down").mkdir(parents=True)
            # (the head's node lost: the next head needs the model too, as on shared disks)
            front = Front(args, state, state / "front.log",
                          keep=not scenario.endswith("-rebuilt"),
                          private=not scenario.startswith("head"))
            try:
                front.wait_ready()
                if reference is None:
                    reference = [c.text for c in _undisturbed(front, args)]
                row = disturbed(front, args, scenario, state)
            finally:
                front.stop()
            clients = row.pop("clients")
            streams.append((scenario, k, row.pop("t0"), row.pop("t_kill"), clients))
            row["completed"] = sum(c.done and c.error is None for c in clients)
            row["exact"] = sum(c.text == r for c, r in zip(clients, reference))
            rows[scenario].append(row)
            print(f"{scenario:6} rep {k + 1}: " + "  ".join(
                f"{key} {value:.1f}" if isinstance(value, float) else f"{key} {value}"
                for key, value in row.items()), flush=True)
    _summary(rows, args)
    print(f"# the fronts' logs: {work}/*/front.log")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        write_streams(args.out / "streams.csv", streams)
        return replot(args.out / "streams.csv")
    return 0


def keeping_cost(args, work: Path) -> int:
    """Undisturbed runs with and without kept cells, interleaved: every client's chunks over
    the time from the clients' start to the last one's end."""
    print(f"# bench_failover --cost: {args.model}, {args.nodes} nodes x {args.cpu} core, "
          f"{args.clients} clients x {args.n} tokens; K={args.K}", flush=True)
    speeds = {True: [], False: []}
    for k in range(args.K):
        for keep in (True, False):
            state = work / f"cost{k}{'kept' if keep else ''}"
            (state / "down").mkdir(parents=True)
            front = Front(args, state, state / "front.log", keep=keep)
            try:
                front.wait_ready()
                t0 = time.monotonic()
                clients = _undisturbed(front, args)
                wall = max(c.chunks[-1][0] for c in clients) - t0
            finally:
                front.stop()
            tokens = sum(len(c.chunks) for c in clients)
            speeds[keep].append(tokens / wall)
            print(f"rep {k + 1} {'kept' if keep else 'none'}: {tokens} chunks in {wall:.1f} s "
                  f"= {tokens / wall:.2f} tokens/s", flush=True)
    on, off = (statistics.median(speeds[x]) for x in (True, False))
    print(f"\nmedian tokens/s: kept {on:.2f}, none {off:.2f}; kept / none = {on / off:.3f}")
    return 0


def write_streams(path: Path, streams: list) -> None:
    """Every chunk's arrival (one token each), seconds since the clients started; the kill as
    client -1."""
    with open(path, "w") as out:
        out.write("scenario,repeat,client,t_s\n")
        for scenario, k, t0, t_kill, clients in streams:
            out.write(f"{scenario},{k},-1,{t_kill - t0:.3f}\n")
            for i, c in enumerate(clients):
                out.writelines(f"{scenario},{k},{i},{at - t0:.3f}\n" for at, _ in c.chunks)


def replot(path: Path) -> int:
    """failover.png beside a streams.csv: the first scenario's first repeat."""
    import csv
    rows = list(csv.DictReader(open(path)))
    first = (rows[0]["scenario"], rows[0]["repeat"])
    sel = [r for r in rows if (r["scenario"], r["repeat"]) == first]
    kill = next(float(r["t_s"]) for r in sel if r["client"] == "-1")
    streams = {}
    for r in sel:
        if r["client"] != "-1":
            streams.setdefault(int(r["client"]), []).append(float(r["t_s"]))
    out = path.with_name("failover.png")
    charts.failover_chart(streams, kill, out, f"{len(streams)} streams, a {first[0]} lost "
                          "(tokens per second, 1 s bins)")
    print(f"wrote {out}")
    return 0


def _undisturbed(front: Front, args) -> list[Client]:
    clients = run_clients(front, args)
    for c in clients:
        c.join(1800)
    assert all(c.done for c in clients), [c.error for c in clients]
    return clients


def _summary(rows: dict, args) -> None:
    print("\nscenario  detect  relaunch+reload  rebuild  first token after kill (median of "
          f"K={args.K}; s)  completed  exact")
    for scenario, reps in rows.items():
        med = {key: statistics.median(r[key] for r in reps)
               for key in ("detect", "relaunch", "rebuild", "total")}
        done = sum(r["completed"] for r in reps)
        exact = sum(r["exact"] for r in reps)
        n = args.clients * len(reps)
        print(f"{scenario:8} {med['detect']:7.1f} {med['relaunch']:16.1f} {med['rebuild']:8.1f}"
              f" {med['total']:8.1f} (max {max(r['total'] for r in reps):.1f})"
              f"  {done}/{n}  {exact}/{n}")


if __name__ == "__main__":
    sys.exit(main())
