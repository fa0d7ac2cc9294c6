#!/usr/bin/env python3
"""pipeinfer against what a user would run instead, on the emulated cluster, in one run:
llama.cpp's RPC backend (ggml-rpc-server on every worker node, llama-completion on node 0),
the same with llama.cpp's speculative decoding (llama-speculative, the draft on node 0, a small
--draft-max sweep), and pipeinfer iterative, speculative and pipeinfer with default flags.

    python experiments/bench_peers.py --nodes 2,4,8 -k 3 -n 128 --out peers.csv
    python experiments/bench_peers.py --nodes 2,4,8 --cpu-per-node 0.25 -k 3 --out scaling.csv
    python experiments/bench_peers.py --replot peers.csv     # the table and chart again

Besides the CSV, each run writes the results pages' table and chart beside it: CSV.md (median
t/s per system and node count, the runs in brackets, and the ratios) and CSV.png (grouped bars,
or t/s against nodes when every node has the same CPU: --cpu-per-node); with --memory also
CSV-memory.md and CSV-memory.png (each node's peak resident memory per system). --replot CSV
draws them again from a CSV without running anything.

Every system gets the same nodes: N nodes share --cpu-total cores evenly (2 cores: 2 x 1,
4 x 0.5, 8 x 0.25), or each has --cpu-per-node cores, one CPU quota per node (experiments/cluster.py's cgroups), 1 thread per
node; node 0 is the head / main host and holds no target layers, the other nodes split the
target's layers evenly (llama.cpp: -ts 1,1,...; pipeinfer: as many layers each as whole layers
allow, those left over on the last nodes: harness/bench_runs.py's even_split);
the extra system pipeinfer-default-split is pipeinfer without --layer-split (its default);
--same-slices gives pipeinfer's workers the very layers llama.cpp gives each rpc-server (the
last one fewer, with the output matrix), for comparing node memory slice for slice. The
prompt is the coding prompt in the target's chat template, greedy, -n tokens with EOS ignored.
Repeats are interleaved (rep, then node count, then system) so the ratios compare like with
like on a noisy machine. Peak resident memory per node is kept for every run (peak_rss_mb).
--prompt TEXT asks something else than the CSV question; --variant NAME=FLAGS (repeatable)
adds a pipeinfer system run with more flags, e.g. --variant "unguarded=--no-guard", so
that two settings are compared within one run. --prompt-tokens N sends a long prompt instead (a Python source file cut to N tokens, then the
coding question): the summary's prefill column (prompt tokens over the time to the first
token: llama-completion's prompt evaluation, pipeinfer's prefill_tps) compares how fast each
system takes a prompt in, e.g. --prompt-tokens 1700 -n 16 for what coding tools send.

The peers are built by experiments/build_peers.py (once, cached); if that fails, one line says
why and the pipeinfer rows still run. A peer that crashes or hangs gets a row saying so.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

if not __package__:   # run as `python experiments/NAME.py`: the repository on the path
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from experiments.harness import build_peers, charts, peer_report  # noqa: E402
from experiments.harness.bench_runs import (RunSpec, run_peer, run_pipeinfer,  # noqa: E402
                                           target_layers, write_row)

CODE_PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
               "category) and returns the total amount per category, sorted by amount.")
PEER_SYSTEMS = ("llama-rpc", "llama-rpc-spec")
PIPEINFER_SYSTEMS = ("iterative", "speculative", "pipeinfer")
EXTRA_SYSTEMS = ("pipeinfer-default-split",)   # pipeinfer's own default split (not the even one)


def render_prompt(model: str, text: str) -> str:
    """The prompt in the target's chat template, as one string every system tokenizes alike."""
    return _with_tokenizer(model, lambda tokenizer: tokenizer.apply_chat_template(text))


def long_prompt(model: str, n_tokens: int) -> str:
    """source_excerpt's coding question in the chat template."""
    return render_prompt(model, source_excerpt(model, n_tokens))


def source_excerpt(model: str, n_tokens: int) -> str:
    """A coding question after a source file cut to `n_tokens` tokens of `model`'s (the
    standard library's difflib, a file every Python has)."""
    import difflib
    import inspect

    def excerpt(tokenizer) -> str:
        source = tokenizer.tokenize(inspect.getsource(difflib), add_special=False)
        if len(source) < n_tokens:
            raise SystemExit(f"{n_tokens} prompt tokens: the source file has only "
                             f"{len(source)}")
        return "```python\n" + tokenizer.detokenize(source[:n_tokens]) + "\n```\n" + CODE_PROMPT

    return _with_tokenizer(model, excerpt)


def _with_tokenizer(model: str, use):
    from pipeinfer.model.models import resolve_model
    from pipeinfer.model.tokenizer import Tokenizer

    tokenizer = Tokenizer(resolve_model(model))
    try:
        return use(tokenizer)
    finally:
        tokenizer.close()


def variants(systems: list[str], sweep: list[int],
             extra: dict[str, tuple[str, ...]]) -> list[tuple[str, str, int | None, tuple]]:
    """(variant name, system, draft max, pipeinfer flags) in the order they run: the systems,
    then the --variant runs (pipeinfer with their flags)."""
    out = []
    for system in systems:
        if system == "llama-rpc-spec":
            out += [(f"llama-rpc-spec-d{d}", system, d, ()) for d in sweep]
        else:
            out.append((system, system, None, ()))
    return out + [(name, "pipeinfer", None, flags) for name, flags in extra.items()]


def parse_variants(specs: list[str], parser) -> dict[str, tuple[str, ...]]:
    """--variant NAME=FLAGS values as {name: flags}."""
    out = {}
    for spec in specs:
        name, sep, flags = spec.partition("=")
        if not sep or not name or name in out:
            parser.error(f"--variant {spec!r}: give NAME=FLAGS, each name once")
        out[name] = tuple(shlex.split(flags))
    return out


def peer_binaries(systems: list[str]) -> Path | None:
    if not any(s in PEER_SYSTEMS for s in systems):
        return None
    try:
        return build_peers.build(os.cpu_count() or 2) / "bin"
    except build_peers.BuildError as err:
        print(f"bench_peers: no llama.cpp peers: {err}; the pipeinfer rows still run",
              file=sys.stderr)
        return None


def summarize(results: dict) -> None:
    """Per node count: median t/s of every variant, the best peer, the ratios of the goals."""
    by_nodes = defaultdict(dict)
    for (nodes, variant), runs in results.items():
        ok = [r["speed_tps"] for r in runs if r.get("speed_tps")]
        by_nodes[nodes][variant] = (statistics.median(ok) if ok else None, runs)
    for nodes, table in by_nodes.items():
        print(f"\n{nodes} nodes:")
        for variant, (tps, runs) in table.items():
            rss = max((max(r.get("peak_rss_mb") or [0]) for r in runs), default=0)
            errors = [r["error"] for r in runs if r.get("error")]
            speeds = " ".join(f"{r['speed_tps']:.2f}" for r in runs if r.get("speed_tps"))
            prefill = _median(runs, "prefill_tps")
            print(f"  {variant:22} {'-' if tps is None else f'{tps:6.2f}':>6} t/s"
                  f"  prefill {'-' if prefill is None else f'{prefill:6.1f}':>6} t/s"
                  f"  max node RSS {rss:6.0f} MB  runs: {speeds}"
                  + (f"  errors: {errors[0]}" if errors else ""))
        peers = {v: t for v, (t, _) in table.items() if v.startswith("llama-rpc") and t}
        best = max(peers.items(), key=lambda kv: kv[1]) if peers else None
        pipe, it = table.get("pipeinfer", (None,))[0], table.get("iterative", (None,))[0]
        rpc = table.get("llama-rpc", (None,))[0]
        if best and pipe:
            print(f"  pipeinfer / best peer ({best[0]}): {pipe / best[1]:.2f}x")
        if rpc and it:
            print(f"  pipeinfer iterative / llama-rpc: {it / rpc:.2f}x")
        for variant, (tps, _) in table.items():
            if it and tps and variant not in ("iterative", *PEER_SYSTEMS) \
                    and not variant.startswith("llama-rpc"):
                print(f"  {variant} / iterative: {tps / it:.2f}x")
        _prefill_ratios(table)
    _scaling(by_nodes)


def head_cpu(r: dict) -> str:
    """A pipeinfer run's head CPU per token (its loop, its draft model), for the progress line."""
    if r.get("head_cpu_ms_per_token") is None:
        return ""
    if r.get("head_loop_cpu_ms_per_token") is None:
        return f", head CPU/token {r['head_cpu_ms_per_token']:.2f} ms"
    line = f", head CPU/token: loop {r['head_loop_cpu_ms_per_token']:.2f} ms"
    if r.get("draft_cpu_ms_per_token") is not None:
        line += f", draft {r['draft_cpu_ms_per_token']:.2f} ms"
    return line


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key)]
    return statistics.median(values) if values else None


def _prefill_ratios(table: dict) -> None:
    """Each pipeinfer system's prefill speed over llama.cpp RPC's prompt evaluation."""
    rpc = _median(table.get("llama-rpc", (None, []))[1], "prefill_tps")
    for variant in PIPEINFER_SYSTEMS:
        mine = _median(table.get(variant, (None, []))[1], "prefill_tps")
        if rpc and mine:
            print(f"  prefill {variant} / llama-rpc: {mine / rpc:.2f}x")


def _scaling(by_nodes: dict) -> None:
    """Each system's speed at every node count over its speed at the fewest nodes."""
    counts = sorted(by_nodes)
    if len(counts) < 2:
        return
    print(f"\nspeed over the same system at {counts[0]} nodes:")
    for variant in by_nodes[counts[0]]:
        base = by_nodes[counts[0]][variant][0]
        ratios = [by_nodes[n].get(variant, (None,))[0] for n in counts]
        if base:
            print(f"  {variant:22} " + "  ".join(f"{n}n {'-' if r is None else f'{r / base:.2f}x'}"
                                               for n, r in zip(counts, ratios)))


def write_report(csv_path: Path, memory: bool, title: str | None,
                 chart: Path | None = None) -> None:
    """The results pages' table and chart from a results CSV, beside it (CSV.md, CSV.png or
    `chart`; with memory also CSV-memory.md and CSV-memory.png)."""
    results = peer_report.load(csv_path)
    if not peer_report.medians(results):
        print(f"bench_peers: no run of {csv_path} has figures: no table, no chart")
        return
    stem = csv_path.with_suffix("")
    chart = chart or stem.with_suffix(".png")
    if peer_report.is_scaling(results):
        table = peer_report.scaling_table(results)
        charts.scaling_chart(results, chart, title or "Speed as nodes are added")
    else:
        table = peer_report.speed_table(results)
        charts.peers_chart(results, chart, title or "pipeinfer and llama.cpp RPC: generation speed")
    stem.with_suffix(".md").write_text(table)
    written = [stem.with_suffix(".md"), chart]
    if memory:
        memory_path = Path(f"{stem}-memory")
        memory_path.with_suffix(".md").write_text(peer_report.memory_table(results))
        charts.memory_chart(results, memory_path.with_suffix(".png"),
                            title or "Peak resident memory per node")
        written += [memory_path.with_suffix(".md"), memory_path.with_suffix(".png")]
    print(table)
    for path in written:
        print(f"wrote {path}")


def _stopped(signum, frame):
    """SIGTERM ends the bench as Ctrl-C does: through every cleanup on the way out (the
    rpc-servers, the nodes' cgroups, a pipeinfer run's cluster.py; Python's default would
    skip them)."""
    signal.signal(signum, signal.SIG_IGN)   # (a second one must not cut the cleanup short)
    raise SystemExit(128 + signum)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen-coder-1.5b")
    parser.add_argument("--draft", default="qwen-coder-0.5b")
    parser.add_argument("--nodes", default="2,4,8", help="node counts (comma-separated)")
    parser.add_argument("--cpu-total", type=float, default=2.0,
                        help="cores shared evenly by the nodes of each setting (default 2)")
    parser.add_argument("--cpu-per-node", type=float, default=None,
                        help="cores of every node whatever their number (instead of "
                             "--cpu-total): the machines a user adds, e.g. --nodes 2,3,4,6,8 "
                             "--cpu-per-node 0.25; the chart is then t/s against nodes")
    parser.add_argument("-n", type=int, default=128, help="tokens to generate")
    parser.add_argument("--prompt", default=CODE_PROMPT, help="the question (chat template added)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="one more pipeinfer system, with these flags (repeatable)")
    parser.add_argument("--prompt-tokens", type=int, default=0,
                        help="a long prompt: a source file cut to this many tokens before the "
                             "coding question (default 0: the question alone)")
    parser.add_argument("-k", type=int, default=3, help="repeats (interleaved)")
    parser.add_argument("--systems", default=",".join(PEER_SYSTEMS + PIPEINFER_SYSTEMS),
                        help="comma-separated, of: " + ", ".join(PEER_SYSTEMS + PIPEINFER_SYSTEMS
                                                                 + EXTRA_SYSTEMS))
    parser.add_argument("--draft-max", default="4,8",
                        help="llama-speculative's --draft-max sweep (best is the peer's figure)")
    parser.add_argument("--period-us", type=int, default=None,
                        help="the CFS period of the nodes' CPU quotas (default: the shortest "
                             "the kernel allows, 2 ms at 0.5 core). A node idle before a "
                             "burst of work runs it faster than its quota for up to about a "
                             "period (15 ms of CPU after idle take 20 ms at 0.5 core under "
                             "10 ms, 28 ms under 2 ms, 30 ms back to back), which favours "
                             "systems whose nodes wait between bursts")
    parser.add_argument("--link", default="none", choices=("none", "gigabit", "slow"),
                        help="shaped links between nodes (experiments/cluster.py presets)")
    parser.add_argument("--same-slices", action="store_true",
                        help="pipeinfer's workers get the layers llama.cpp gives each "
                             "rpc-server under -ts 1,1,... (the last fewer, with the output "
                             "matrix) instead of an even split: for comparing node memory "
                             "slice for slice")
    parser.add_argument("--out", default="peers.csv", help="results CSV (appended)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--memory", action="store_true",
                        help="also the table and chart of each node's peak resident memory")
    parser.add_argument("--title", help="the chart's title")
    parser.add_argument("--chart", type=Path, help="where the chart goes (default: CSV.png)")
    parser.add_argument("--replot", type=Path, metavar="CSV",
                        help="run nothing: draw the table and chart of this CSV again")
    return parser


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _stopped)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.replot:
        write_report(args.replot, args.memory, args.title, args.chart)
        return 0
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in PEER_SYSTEMS + PIPEINFER_SYSTEMS + EXTRA_SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}")
    node_counts = [int(n) for n in args.nodes.split(",")]
    if args.cpu_per_node and args.cpu_per_node * max(node_counts) > (os.cpu_count() or 1):
        parser.error(f"{max(node_counts)} nodes x {args.cpu_per_node:g} core need more than "
                     f"this machine's {os.cpu_count()} cores")
    bin_dir = peer_binaries(systems)
    if bin_dir is None:
        systems = [s for s in systems if s not in PEER_SYSTEMS]
    extra = parse_variants(args.variant, parser)
    prompt = (long_prompt(args.model, args.prompt_tokens) if args.prompt_tokens
              else render_prompt(args.model, args.prompt))
    n_layer = target_layers(args.model)
    results = defaultdict(list)
    for rep in range(args.k):
        for nodes in node_counts:
            for variant, system, draft_max, flags in variants(
                    systems, [int(d) for d in args.draft_max.split(",")], extra):
                spec = RunSpec(system=system, variant=variant, nodes=nodes,
                               cpu=args.cpu_per_node or args.cpu_total / nodes,
                               model=args.model, draft=args.draft,
                               prompt=prompt, n=args.n, link=args.link, draft_max=draft_max,
                               timeout=args.timeout, n_layer=n_layer,
                               same_slices=args.same_slices, flags=flags,
                               period_us=args.period_us)
                t0 = time.time()
                r = run_peer(spec, bin_dir) if system in PEER_SYSTEMS else run_pipeinfer(spec)
                results[nodes, variant].append(r)
                write_row(args.out, spec, r)
                print(f"# rep {rep} {nodes} nodes {variant}: "
                      + (f"failed: {r['error']}" if r.get("error") else
                         f"{r['speed_tps']:.2f} t/s, {r['n_generated']} tokens, accept "
                         f"{r.get('accept_rate')}, RSS {r.get('peak_rss_mb')}"
                         + head_cpu(r))
                      + f" ({time.time() - t0:.0f} s)", flush=True)
    summarize(results)
    write_report(Path(args.out), args.memory, args.title, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
