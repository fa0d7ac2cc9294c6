#!/usr/bin/env python3
"""`pipeinfer serve` against llama.cpp's `llama-server` over RPC, as clients see them, on the
emulated cluster (4 nodes x 0.5 core by default, node 0 the head / main host without target
layers), in one run: every repeat starts each server afresh, asks the chat prompts one after
another (1 client), then all at once (4 clients), and stops it.

    python experiments/bench_serve.py -k 3        # needs root (cgroups) and the peers built
                                                  # (experiments/build_peers.py, ~7 min once)

Speed is what a client sees: completion tokens over the request's wall time, prefill
included (1 client: the mean over its requests); aggregate = all completion tokens over the
wall time of the whole batch of concurrent requests. TTFT is from sending the request to its
first streamed text. Both servers get the same chat messages, greedy, `max_tokens` -n, no
prompt cache (llama-server: `cache_prompt: false`); pipeinfer with its default flags
(--strategy pipeinfer -md DRAFT --parallel N), llama-server with `-np N` (continuous
batching of its slots, its default) and the target's layers even on the workers.
Prints a line per request batch, then medians and the ratios; --csv writes one row per
system, repeat and phase.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.harness import CLUSTER, ROOT  # noqa: E402
from experiments.harness.bench_runs import even_split, target_layers  # noqa: E402
from experiments.harness.cpu_quota import CpuQuotas, host_cpu  # noqa: E402
from experiments.harness.peers import PeerCluster, last_line  # noqa: E402

PROMPTS = (
    "Write a Python function that parses a CSV file of transactions (date, amount, category) "
    "and returns the total amount per category, sorted by amount.",
    "Write a Python class for an LRU cache with get and put methods, with docstrings.",
    "Write a Python function that checks whether a string is a valid IPv4 address, and a few "
    "unit tests for it.",
    "Write a Python script that counts the words in a text file and prints the ten most "
    "common ones with their counts.",
)
READY_TIMEOUT_S = 600
BUSY_SETTLE_S = 1.5   # > serve's BUSY_EVERY_S: the busy figures are fresh after it


@dataclass(frozen=True)
class Answer:
    text: str
    n_tokens: int
    ttft_s: float
    start: float
    end: float

    @property
    def speed(self) -> float:
        return self.n_tokens / (self.end - self.start)


def stream_chat(url: str, messages: list[dict], n: int, extra: dict,
                timeout: float = 600) -> tuple[str, dict | None, float, float | None, float]:
    """One streamed greedy chat request: (text, usage, start, first content, end), times
    from time.perf_counter (also bench_turns.py's)."""
    body = {"messages": messages, "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    start, first, parts, usage = time.perf_counter(), None, [], None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=timeout) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read().decode()[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.perf_counter()
                parts.append(piece)
    return "".join(parts), usage, start, first, time.perf_counter()


def ask(url: str, prompt: str, n: int, extra: dict) -> Answer:
    """One streamed chat request: its text, completion tokens, TTFT and wall time."""
    text, usage, start, first, end = stream_chat(
        url, [{"role": "user", "content": prompt}], n, extra)
    if not usage:
        raise RuntimeError("the stream ended without usage")
    return Answer(text, usage["completion_tokens"], (first or end) - start, start, end)


def ask_all(url: str, prompts, n: int, extra: dict) -> list[Answer]:
    """The prompts at once, one client (thread) each."""
    answers: list[Answer | Exception | None] = [None] * len(prompts)

    def one(i: int) -> None:
        try:
            answers[i] = ask(url, prompts[i], n, extra)
        except Exception as err:  # noqa: BLE001 (reported below)
            answers[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a in answers:
        if not isinstance(a, Answer):
            raise RuntimeError(f"a request failed: {a}")
    return answers  # type: ignore[return-value]


def wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): "
                               f"{last_line(log.read_text(errors='replace'))}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not ready within {READY_TIMEOUT_S} s")


# pipeinfer's systems: their strategy flags (the rest as for every pipeinfer system)
PIPEINFER_SYSTEMS = {"pipeinfer": ["--strategy", "pipeinfer", "-md", "{draft}"],
                     "pipeinfer-speculative": ["--strategy", "speculative", "-md", "{draft}"],
                     "pipeinfer-iterative": ["--strategy", "iterative"],
                     # no draft model: drafts from n-gram lookups (and a grammar's forced text)
                     "pipeinfer-ngram": ["--strategy", "pipeinfer", "--draft-source", "ngram"],
                     # the plain weight layout: exact runs of up to 7 tokens instead of 3
                     "pipeinfer-plain": ["--strategy", "pipeinfer", "-md", "{draft}",
                                         "--no-repack"],
                     # speculative on the plain layout: the grammar's forced text fills runs of 7
                     "pipeinfer-speculative-plain": ["--strategy", "speculative", "-md", "{draft}",
                                                     "--no-repack"],
                     # the prompt cache as llama-server's: the whole kept prefix (not exact)
                     "pipeinfer-llama-cache": ["--strategy", "pipeinfer", "-md", "{draft}",
                                               "--cache-prompt", "llama-server"],
                     # the prompt's tokens after its last whole chunk as one batch
                     "pipeinfer-one-tail": ["--strategy", "pipeinfer", "-md", "{draft}",
                                            "--prefill-tail", "0"],
                     # a conversation's answer refilled while it is generated
                     "pipeinfer-refill-along": ["--strategy", "pipeinfer", "-md", "{draft}",
                                                "--refill-along"],
                     # ... or once the pipeline is idle (the default, named)
                     "pipeinfer-idle-refill": ["--strategy", "pipeinfer", "-md", "{draft}",
                                               "--no-refill-along"],
                     # drafts from the draft model only (no n-gram lookup of the text first)
                     "pipeinfer-model-drafts": ["--strategy", "pipeinfer", "-md", "{draft}",
                                                "--draft-source", "model"]}


class PipeinferServer:
    """`pipeinfer serve` under experiments/cluster.py (one rank per emulated node)."""
    extra: dict = {}

    def __init__(self, args, name: str = "pipeinfer"):
        split = args.split or ",".join(repr(f) for f in even_split(
            target_layers(args.model), args.nodes - 1))
        flags = [f.format(draft=args.draft) for f in PIPEINFER_SYSTEMS[name]]
        serve = [str(Path(sys.executable).parent / "pipeinfer"), "serve", "-m", args.model,
                 *flags, "--layer-split", split, "--parallel", str(args.clients), "--port", "0",
                 "-c", str(getattr(args, "ctx", 2048))]
        self.command = [sys.executable, str(CLUSTER), "--nodes", str(args.nodes),
                        "--cpu", f"{args.cpu:g}", "--", *serve]
        self.log = Path(f"/tmp/pipeinfer-bench-serve-{os.getpid()}.log")

    def __enter__(self) -> str:
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=err,
                                         start_new_session=True, cwd=ROOT)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (said := re.search(r"listening on (http://\S+)", self.log.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pipeinfer serve did not start: {last_line(self.log.read_text())}")
            time.sleep(0.2)
        url = said.group(1)
        wait_healthy(url, self.proc, self.log)
        return url

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.unlink(missing_ok=True)


class LlamaServer:
    """llama-server on node 0 with --rpc to a ggml-rpc-server on every other node, each in
    its node's CPU quota (experiments/peers.py)."""
    extra = {"cache_prompt": False}

    def __init__(self, args, bin_dir: Path):
        from pipeinfer.model.models import resolve_model

        self.args, self.bin_dir = args, bin_dir
        self.model = str(resolve_model(args.model))
        self.log = Path(f"/tmp/pipeinfer-bench-llama-server-{os.getpid()}.log")

    def __enter__(self) -> str:
        a = self.args
        self.quotas = CpuQuotas(uuid.uuid4().hex[:6], [a.cpu] * a.nodes)
        self.quotas.create()
        self.cluster = PeerCluster(self.bin_dir, self.quotas).__enter__()
        port = free_port()
        workers = a.nodes - 1
        command = [str(self.bin_dir / "llama-server"), "-m", self.model, "-t", "1", "-tb", "1",
                   "-c", str(getattr(a, "ctx", 1024) * a.clients), "-np", str(a.clients),
                   "--host", "127.0.0.1",
                   "--port", str(port), "--rpc", self.cluster.endpoints(),
                   "-dev", ",".join(f"RPC{i}" for i in range(workers)), "-ngl", "99",
                   "-ts", tensor_split(a.split, workers), "-fit", "off"]
        with open(self.log, "w") as out:
            self.proc = self.cluster.start_main(command, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, self.proc, self.log)
        return url

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.cluster.__exit__(None, None, None)
        self.quotas.remove()
        self.log.unlink(missing_ok=True)


def tensor_split(split: str | None, workers: int) -> str:
    """llama-server's -ts for pipeinfer's --layer-split (the head's share must be 0: the
    main host holds no layers there): the workers' shares; even without a split."""
    if split is None:
        return ",".join("1" for _ in range(workers))
    shares = split.split(",")
    if len(shares) != workers + 1 or float(shares[0]) != 0:
        raise SystemExit(f"bench_serve: --split needs {workers + 1} shares, the first 0")
    return ",".join(shares[1:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_server(server, args) -> dict:
    """Start `server`, the 1-client phase, the N-client phase, stop it; the figures."""
    prompts = PROMPTS[:args.clients]
    with server as url:
        ask(url, "Say hi.", 4, server.extra)   # warm-up (not counted)
        single = [ask(url, p, args.n, server.extra) for p in prompts]
        pipeinfer = isinstance(server, PipeinferServer)
        before = stage_busy(url) if pipeinfer else None
        batch = ask_all(url, prompts, args.n, server.extra)
        after = stage_busy(url) if before else None
    wall = max(a.end for a in batch) - min(a.start for a in batch)
    busy = [round((after[r] - before[r]) / wall, 2) for r in sorted(after)] if after else None
    return {"single_tps": statistics.mean(a.speed for a in single),
            "aggregate_tps": sum(a.n_tokens for a in batch) / wall,
            "single_ttft": [a.ttft_s for a in single], "batch_ttft": [a.ttft_s for a in batch],
            "tokens": [a.n_tokens for a in single + batch],
            "texts": [a.text for a in single], "batch_texts": [a.text for a in batch],
            "batch_busy": busy}


def stage_busy(url: str) -> dict[int, float] | None:
    """pipeinfer's /metrics: each rank's busy seconds (None if it has none), read after
    waiting out the busy probe's interval (serve/loop.py: the figures are at most
    BUSY_EVERY_S old)."""
    try:
        time.sleep(BUSY_SETTLE_S)
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    found = re.findall(r'pipeinfer_stage_busy_seconds\{rank="(\d+)"\} (\S+)', text)
    return {int(rank): float(value) for rank, value in found} or None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize(results: dict[str, list[dict]], clients: int) -> None:
    print(f"\n{'system':<14}{'1 client t/s':>14}{f'{clients} clients agg':>18}"
          f"{'TTFT p50/p95 (1)':>20}{f'TTFT p50/p95 ({clients})':>20}   runs (1 / {clients})")
    med = {}
    for name, runs in results.items():
        single = [r["single_tps"] for r in runs]
        agg = [r["aggregate_tps"] for r in runs]
        t1 = [t for r in runs for t in r["single_ttft"]]
        tn = [t for r in runs for t in r["batch_ttft"]]
        med[name] = (statistics.median(single), statistics.median(agg))
        print(f"{name:<14}{med[name][0]:>14.2f}{med[name][1]:>18.2f}"
              f"{percentile(t1, .5):>11.2f}/{percentile(t1, .95):<8.2f}"
              f"{percentile(tn, .5):>11.2f}/{percentile(tn, .95):<8.2f}   "
              + " ".join(f"{s:.2f}" for s in single) + " / "
              + " ".join(f"{a:.2f}" for a in agg))
    for name in med:
        if name == "llama-server":
            continue
        p, l = med[name], med.get("llama-server")
        against = (f"/ llama-server: 1 client {p[0] / l[0]:.2f}x, {clients} clients "
                   f"{p[1] / l[1]:.2f}x; " if l else "")
        print(f"{name} {against}{clients} clients / its 1 client {p[1] / p[0]:.2f}x")
    for name, runs in results.items():
        same = all(r["batch_texts"] == r["texts"] for r in runs)
        print(f"{name}: answers at once equal the answers alone: {same}")
    if {"pipeinfer", "llama-server"} <= results.keys():
        same = results["pipeinfer"][0]["texts"] == results["llama-server"][0]["texts"]
        print(f"pipeinfer's answers equal llama-server's: {same}")


def write_csv(path: str, name: str, rep: int, r: dict, args) -> None:
    new = not Path(path).exists()
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["time", "system", "rep", "nodes", "cpu", "model", "draft", "n",
                        "clients", "single_tps", "aggregate_tps", "ttft_single", "ttft_batch"])
        w.writerow([time.strftime("%Y-%m-%dT%H:%M:%S"), name, rep, args.nodes, args.cpu,
                    args.model, args.draft if name == "pipeinfer" else "", args.n, args.clients,
                    f"{r['single_tps']:.3f}", f"{r['aggregate_tps']:.3f}",
                    " ".join(f"{t:.3f}" for t in r["single_ttft"]),
                    " ".join(f"{t:.3f}" for t in r["batch_ttft"])])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-k", type=int, default=3, help="repeats (interleaved)")
    p.add_argument("-n", type=int, default=64, help="max_tokens of every request")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--cpu", type=float, default=0.5, help="cores per node")
    p.add_argument("--clients", type=int, default=4, choices=range(1, len(PROMPTS) + 1),
                   help="concurrent clients (and --parallel / -np)")
    p.add_argument("-m", "--model", default="qwen-coder-1.5b")
    p.add_argument("-md", "--draft", default="qwen-coder-0.5b")
    p.add_argument("--systems", default="pipeinfer,llama-server",
                   help="comma list of: llama-server, " + ", ".join(PIPEINFER_SYSTEMS))
    p.add_argument("--split", default=None,
                   help="pipeinfer's --layer-split, and llama-server's -ts of its workers' "
                        "shares (default: the head none, the rest even, pipeinfer's leftover "
                        "layers on the last workers: bench_runs.even_split)")
    p.add_argument("--csv", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems = args.systems.split(",")
    unknown = set(systems) - {"llama-server", *PIPEINFER_SYSTEMS}
    if unknown:
        print(f"bench_serve: unknown system(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    bin_dir = None
    if "llama-server" in systems:
        from experiments.harness import build_peers
        bin_dir = build_peers.build(os.cpu_count() or 2) / "bin"
    print(f"host: {host_cpu()}; {args.nodes} nodes x {args.cpu:g} core, {args.model} + {args.draft}, "
          f"{args.n} tokens a request, {args.clients} clients", flush=True)
    results: dict[str, list[dict]] = {s: [] for s in systems}
    for rep in range(args.k):
        for name in systems:
            server = (LlamaServer(args, bin_dir) if name == "llama-server"
                      else PipeinferServer(args, name))
            t0 = time.monotonic()
            try:
                r = one_server(server, args)
            except (RuntimeError, httpx.HTTPError) as err:
                print(f"bench_serve: {name}: {err}", file=sys.stderr)
                return 1
            results[name].append(r)
            busy = (f", busy during the batch (rank 0 first) {r['batch_busy']}"
                    if r["batch_busy"] else "")
            print(f"# rep {rep} {name}: 1 client {r['single_tps']:.2f} t/s, {args.clients} "
                  f"clients {r['aggregate_tps']:.2f} t/s aggregate, tokens {r['tokens']}{busy} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            if args.csv:
                write_csv(args.csv, name, rep, r, args)
    summarize(results, args.clients)
    return 0


if __name__ == "__main__":
    sys.exit(main())
