#!/usr/bin/env python3
"""What the prompt cache and grammar drafts bring to clients, on the emulated cluster (4 nodes
x 0.5 core, node 0 the head / main host without target layers), as experiments/bench_serve.py
runs the servers:

- turns: a 6-turn coding conversation, 1 client. Turn 1 pastes a source file (the first 90
  lines of Python's textwrap.TextWrapper, about 950 tokens) with a question; each later turn
  adds a question of at most 60 tokens to the history, which keeps every answer. pipeinfer
  serve and llama-server over RPC, each with its prompt cache (their default); per turn the
  time to first token, the prompt tokens and how many of them were reused. With --think S,
  each question comes S seconds after the answer before it, as a user reading it would ask.
- long: one request whose prompt is a source file of --long-tokens tokens (Python's difflib)
  and a coding question, to each server afresh: its time to first token, which is the
  prompt's evaluation (prefill) but for one token.
- json: one JSON-schema request (a list of 5 objects of 4 fields), pipeinfer's strategy (or
  --json-system pipeinfer-speculative) with the text the grammar forces drafted for free and
  without (PIPEINFER_FREE_DRAFTS=0); speed is completion tokens over the request's wall time.

    python experiments/bench_turns.py -k 3 --scenario turns,long,json   # root (cgroups), peers built

Every repeat starts each server afresh. Prints a line per repeat, then medians.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

import httpx

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.bench_serve import (PIPEINFER_SYSTEMS, LlamaServer,  # noqa: E402
                                     PipeinferServer, host_cpu, stream_chat)
from experiments.bench_peers import source_excerpt  # noqa: E402
from experiments.harness.json_task import JSON_ASK, SCHEMA  # noqa: E402

QUESTIONS = (
    "Explain briefly what this class does and which of its options matter most.",
    "How does _split handle hyphenated words? Answer in two sentences.",
    "Write a short docstring for _munge_whitespace.",
    "Is there a bug when width is smaller than the indent? Explain briefly.",
    "Write one unit test for the break_on_hyphens option.",
    "Summarize the whole conversation in three bullet points.",
)
SOURCE_LINES = 90


def source_file() -> str:
    lines = inspect.getsource(textwrap.TextWrapper).splitlines()[:SOURCE_LINES]
    return "\n".join(lines)


def chat(url: str, messages: list[dict], n: int, extra: dict) -> dict:
    """One streamed chat request: text, TTFT, wall time and usage."""
    text, usage, start, first, end = stream_chat(url, messages, n, extra, timeout=900)
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"text": text, "ttft": (first or end) - start, "wall": end - start,
            "prompt": usage.get("prompt_tokens"), "cached": cached,
            "tokens": usage.get("completion_tokens")}


def conversation(url: str, n: int, extra: dict, think_s: float = 0.0) -> list[dict]:
    """The 6 turns, each answer kept in the history, the next asked `think_s` seconds after
    it (a user reading the answer)."""
    messages, turns = [], []
    for i, question in enumerate(QUESTIONS):
        if i:
            time.sleep(think_s)
        content = f"```python\n{source_file()}\n```\n\n{question}" if i == 0 else question
        messages.append({"role": "user", "content": content})
        turn = chat(url, messages, n, extra)
        turns.append(turn)
        messages.append({"role": "assistant", "content": turn["text"]})
    return turns


def run_turns(args, bin_dir) -> dict[str, list[list[dict]]]:
    results: dict[str, list[list[dict]]] = {s: [] for s in args.systems}
    for rep in range(args.k):
        for name in args.systems:
            server = (LlamaServer(args, bin_dir) if name == "llama-server"
                      else PipeinferServer(args, name))
            extra = {"cache_prompt": True}
            with server as url:
                chat(url, [{"role": "user", "content": "Say hi."}], 4, extra)  # warm-up
                turns = conversation(url, args.n, extra, args.think)
            results[name].append(turns)
            print(f"# turns rep {rep} {name}: TTFT "
                  + " ".join(f"{t['ttft']:.2f}" for t in turns) + " s; prompt/cached "
                  + " ".join(f"{t['prompt']}/{t['cached']}" for t in turns)
                  + "; tokens " + " ".join(str(t["tokens"]) for t in turns)
                  + "; decode t/s " + " ".join(f"{decode_tps(t):.1f}" for t in turns),
                  flush=True)
    return results


def decode_tps(turn: dict) -> float:
    """A turn's tokens after its first over the time after its first token."""
    after = turn["wall"] - turn["ttft"]
    return (turn["tokens"] - 1) / after if after > 0 and turn["tokens"] else 0.0


def summarize_turns(results: dict[str, list[list[dict]]]) -> None:
    print("\nturns: median TTFT per turn (s), turn 1 / median of turns 2-6")
    med = {}
    for name, reps in results.items():
        per_turn = [statistics.median(r[i]["ttft"] for r in reps) for i in range(len(QUESTIONS))]
        later = statistics.median(per_turn[1:])
        med[name] = (per_turn, later)
        decode = statistics.median(decode_tps(t) for r in reps for t in r)
        print(f"{name:<14}" + " ".join(f"{t:6.2f}" for t in per_turn)
              + f"   turn 1 / later: {per_turn[0] / later:.1f}x; decode {decode:.2f} t/s")
    if "llama-server" in med:
        base = med["llama-server"][1]
        for name in (n for n in med if n != "llama-server"):
            p = med[name][1]
            print(f"turns 2-6 median TTFT: {name} {p:.2f} s, llama-server {base:.2f} s "
                  f"({name} / llama-server {p / base:.2f}x)")
    if {"pipeinfer", "llama-server"} <= med.keys():
        same = [a["text"] == b["text"] for a, b in zip(results["pipeinfer"][0],
                                                       results["llama-server"][0])]
        print(f"pipeinfer's answers equal llama-server's, per turn: {same}")
    for name, reps in results.items():
        stable = all([t["text"] for t in r] == [t["text"] for t in reps[0]] for r in reps)
        print(f"{name}: the same answers in every repeat: {stable}")


def run_long(args, bin_dir) -> dict[str, list[dict]]:
    """The long prompt on every system, each repeat on servers started afresh."""
    text = source_excerpt(args.model, args.long_tokens)
    results: dict[str, list[dict]] = {s: [] for s in args.systems}
    for rep in range(args.k):
        for name in args.systems:
            server = (LlamaServer(args, bin_dir) if name == "llama-server"
                      else PipeinferServer(args, name))
            with server as url:
                chat(url, [{"role": "user", "content": "Say hi."}], 4, {})  # warm-up
                answer = chat(url, [{"role": "user", "content": text}], args.n, {})
            results[name].append(answer)
            print(f"# long rep {rep} {name}: TTFT {answer['ttft']:.2f} s, prompt "
                  f"{answer['prompt']} tokens ({answer['cached']} reused), "
                  f"{answer['tokens']} tokens", flush=True)
    return results


def summarize_long(results: dict[str, list[dict]]) -> None:
    print("\nlong: median TTFT (s) and prompt tokens over it")
    med = {}
    for name, runs in results.items():
        med[name] = statistics.median(a["ttft"] for a in runs)
        evaluated = statistics.median(a["prompt"] - (a["cached"] or 0) for a in runs)
        print(f"{name:<14} {med[name]:6.2f} s  {evaluated / med[name]:6.1f} t/s")
    if "llama-server" in med:
        for name in (n for n in med if n != "llama-server"):
            print(f"long: TTFT llama-server / {name}: {med['llama-server'] / med[name]:.2f}x")


def run_json(args) -> dict[str, list[dict]]:
    """The JSON-schema request on pipeinfer (--json-system) with free drafts on and off."""
    results: dict[str, list[dict]] = {"free drafts": [], "no free drafts": []}
    body = {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "languages", "schema": SCHEMA}}}
    for rep in range(args.k):
        for label, value in (("free drafts", "1"), ("no free drafts", "0")):
            os.environ["PIPEINFER_FREE_DRAFTS"] = value
            with PipeinferServer(args, args.json_system) as url:
                chat(url, [{"role": "user", "content": "Say hi."}], 4, {})  # warm-up
                answer = chat(url, [{"role": "user", "content": JSON_ASK}], args.json_n, body)
                answer["metrics"] = free_metrics(url)
            results[label].append(answer)
            print(f"# json rep {rep} {label}: parses {parses(answer['text'])}, "
                  f"{answer['tokens']} tokens in "
                  f"{answer['wall']:.2f} s = {answer['tokens'] / answer['wall']:.2f} t/s; "
                  f"{answer['metrics']}", flush=True)
    os.environ.pop("PIPEINFER_FREE_DRAFTS", None)
    return results


def parses(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def free_metrics(url: str) -> dict:
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for name in ("drafted_tokens", "accepted_tokens", "drafted_free_tokens",
                 "drafts_cut_tokens"):
        line = next((x for x in text.splitlines()
                     if x.startswith(f"pipeinfer_{name}_total ")), None)
        out[name] = float(line.split()[1]) if line else None
    return out


def summarize_json(results: dict[str, list[dict]]) -> None:
    speed = {k: statistics.median(a["tokens"] / a["wall"] for a in v)
             for k, v in results.items()}
    print(f"\njson: median t/s, free drafts {speed['free drafts']:.2f}, without "
          f"{speed['no free drafts']:.2f} ({speed['free drafts'] / speed['no free drafts']:.2f}x)")
    texts = {a["text"] for v in results.values() for a in v}
    print(f"json: the same answer in every run, free drafts or not: {len(texts) == 1}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-k", type=int, default=3, help="repeats")
    p.add_argument("-n", type=int, default=64, help="max_tokens of every turn")
    p.add_argument("--think", type=float, default=0.0, metavar="S",
                   help="turns: seconds between an answer and the next question (a user "
                        "reading it; pipeinfer's exact cache refills the answer meanwhile)")
    p.add_argument("--json-n", type=int, default=256, help="max_tokens of the JSON request")
    p.add_argument("--long-tokens", type=int, default=2000,
                   help="long: the source file's tokens in the prompt")
    p.add_argument("--scenario", default="turns,json", help="a comma list of turns, long, json")
    p.add_argument("--json-system", default="pipeinfer",
                   help="the json scenario's server: one of bench_serve.PIPEINFER_SYSTEMS",
                   choices=sorted(PIPEINFER_SYSTEMS))
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--cpu", type=float, default=0.5, help="cores per node")
    p.add_argument("-m", "--model", default="qwen-coder-1.5b")
    p.add_argument("-md", "--draft", default="qwen-coder-0.5b")
    p.add_argument("--systems", default="pipeinfer,llama-server")
    p.add_argument("--split", default=None)
    args = p.parse_args(argv)
    args.systems = args.systems.split(",")
    args.clients = 1
    args.ctx = 4096     # context per slot, both servers (bench_serve's servers read it)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scenarios = args.scenario.split(",")
    print(f"host: {host_cpu()}; {args.nodes} nodes x {args.cpu:g} core, {args.model} + "
          f"{args.draft}; turns: {args.n} tokens an answer; json: up to {args.json_n} "
          f"tokens, {args.json_system}",
          flush=True)
    bin_dir = None
    if "llama-server" in args.systems and {"turns", "long"} & set(scenarios):
        from experiments.harness import build_peers
        bin_dir = build_peers.build(os.cpu_count() or 2) / "bin"
    if "turns" in scenarios:
        summarize_turns(run_turns(args, bin_dir))
    if "long" in scenarios:
        summarize_long(run_long(args, bin_dir))
    if "json" in scenarios:
        summarize_json(run_json(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
