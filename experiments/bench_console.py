#!/usr/bin/env python3
"""What the web console costs `pipeinfer serve --ranks N`: the same batch of greedy requests
served with nobody watching and with a console open on the live view (headless Chromium,
redrawing at every sample), interleaved K times; then the front's CPU while a console is
open and the job idle (and while none is), read from /proc/PID/stat. The host is named by
llama.cpp's own llama-bench (1 thread, tg) on the same model.

    flock /tmp/cpu.lock .venv/bin/python experiments/bench_console.py -K 3

Defaults: Qwen2.5-Coder 1.5B on 3 ranks of this machine, 4 clients of 64 tokens at once,
30 s of idle CPU. Prints one line per batch and a summary; --json FILE writes them too.
Needs Playwright (install.sh test) and the distribution's Chromium (/usr/bin/chromium).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
PIPEINFER = Path(sys.executable).parent / "pipeinfer"
CHROMIUM = "/usr/bin/chromium"
PROMPTS = ["Write a Python function that parses a CSV file of transactions and returns the "
           "total amount per category, sorted by amount.",
           "Write a Python class for an LRU cache with get and put in O(1).",
           "Write a Python function that checks whether a string of brackets is balanced.",
           "Write a Python script that counts the words in a text file and prints the ten "
           "most common ones."]
TICKS = os.sysconf("SC_CLK_TCK")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen-coder-1.5b", help="the served model")
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("-K", type=int, default=3, help="batches of each kind, interleaved")
    ap.add_argument("--clients", type=int, default=4, help="requests at once per batch")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per request")
    ap.add_argument("--idle-s", type=float, default=30.0, help="seconds of idle CPU read")
    ap.add_argument("--json", help="write the results here")
    return ap.parse_args()


def resolve(model: str) -> str:
    from pipeinfer.model.models import resolve_model

    return str(resolve_model(model))


def host_figure(model: str) -> str:
    """llama-bench's tg figure on 1 thread for `model` (this host's name in the results)."""
    where = subprocess.run([sys.executable, str(HERE / "build_peers.py"), "--where"],
                           capture_output=True, text=True).stdout.strip()
    bench = Path(where) / "llama-bench"
    if not bench.exists():
        return "llama-bench not built (experiments/build_peers.py)"
    out = subprocess.run([str(bench), "-m", model, "-t", "1", "-p", "0", "-n", "32", "-o",
                          "json"], capture_output=True, text=True).stdout
    try:
        row = json.loads(out)[-1]
    except (ValueError, IndexError):
        return f"llama-bench said: {out.strip()[-200:]}"
    return (f"{row['cpu_info']}, llama-bench tg32 1 thread {row['avg_ts']:.2f} "
            f"+- {row['stddev_ts']:.2f} t/s ({row['model_type']})")


class Server:
    """`pipeinfer serve --ranks N` on a free port, its front's pid."""

    def __init__(self, model: str, ranks: int, tmp: Path):
        self.err = tmp / "stderr.txt"
        env = dict(os.environ, TMPDIR=str(tmp))
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen([str(PIPEINFER), "serve", "--ranks", str(ranks),
                                          "-m", model, "--port", "0", "--parallel", "4"],
                                         stdout=subprocess.DEVNULL, stderr=err, env=env,
                                         start_new_session=True)
        self.url = ""

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            said = re.search(r"listening on (http://[^\s;]+)", self.err.read_text())
            if said:
                self.url = said.group(1)
                try:
                    if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.5)
        raise RuntimeError(f"not ready:\n{self.err.read_text()[-2000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def batch(url: str, clients: int, tokens: int) -> dict:
    """`clients` greedy chat requests at once: wall seconds and tokens per second."""
    results: list[int] = []

    def one(prompt: str) -> None:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                "temperature": 0, "ignore_eos": True}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=900)
        r.raise_for_status()
        results.append(r.json()["usage"]["completion_tokens"])

    threads = [threading.Thread(target=one, args=(PROMPTS[i % len(PROMPTS)],))
               for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"wall_s": round(wall, 3), "tokens": sum(results),
            "tokens_per_s": round(sum(results) / wall, 3)}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def idle_cpu(pid: int, seconds: float) -> float:
    """The front's CPU (share of a core) over `seconds`."""
    c0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(pid) - c0) / (time.monotonic() - t0)


def main() -> int:
    args = parse_args()
    from playwright.sync_api import sync_playwright

    model = resolve(args.model)
    out: dict = {"host": host_figure(model), "model": Path(model).name, "ranks": args.ranks,
                 "clients": args.clients, "tokens": args.tokens, "batches": []}
    print("host (llama-bench, 1 thread):", out["host"], flush=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        server = Server(model, args.ranks, Path(tmp))
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            server.wait_ready()
            batch(server.url, args.clients, 8)   # (warm-up: every slot once)
            for k in range(args.K):
                for watched in ((False, True) if k % 2 == 0 else (True, False)):
                    page = None
                    if watched:
                        page = browser.new_page(viewport={"width": 1280, "height": 800})
                        page.goto(server.url + "/ui#live")
                        page.wait_for_selector("#live-figures .figure")
                    row = {"k": k, "console": watched, **batch(server.url, args.clients,
                                                              args.tokens)}
                    if page is not None:
                        row["samples_seen"] = int(page.locator("#view-live")
                                                  .get_attribute("data-samples"))
                        page.close()
                    out["batches"].append(row)
                    print(json.dumps(row), flush=True)
            time.sleep(3)   # (the job's last pulse)
            out["idle_cpu_no_console"] = round(idle_cpu(server.proc.pid, args.idle_s), 4)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(server.url + "/ui#live")
            page.wait_for_selector("#live-figures .figure")
            time.sleep(2)
            out["idle_cpu_console_open"] = round(idle_cpu(server.proc.pid, args.idle_s), 4)
            page.close()
        finally:
            browser.close()
            server.stop()
    summarise(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def summarise(out: dict) -> None:
    speed = {w: [b["tokens_per_s"] for b in out["batches"] if b["console"] == w]
             for w in (False, True)}
    med = {w: statistics.median(v) for w, v in speed.items()}
    out["ratio"] = round(med[True] / med[False], 3)
    print(f"tokens/s without a console {speed[False]} (median {med[False]:.2f}), with one "
          f"open {speed[True]} (median {med[True]:.2f}): {out['ratio']:.3f}x")
    print(f"front CPU while idle: {100 * out['idle_cpu_no_console']:.2f} % of a core without "
          f"a console, {100 * out['idle_cpu_console_open']:.2f} % with one open")


if __name__ == "__main__":
    sys.exit(main())
