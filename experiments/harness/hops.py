"""Where a token's time goes between the stages of a plain pipeline (the cost per hop), read
from a `pipeinfer run --strategy iterative --trace FILE` trace: per hop, the median gap
between one stage's end and the next one's start (send, wake-up, receive and the Python around
the decode call), each stage's median compute, and the head's turnaround (result taken in ->
next run sent); and, for the prompt's runs, how busy each stage was while it went in.

Spans of every rank are in the head's clock (offsets measured at start-up, to within half a
round trip). Runs are the generated tokens' runs (the prompt's and the first `skip` left
out); a run whose spans are not one per stage is skipped. `experiments/bench_stage.py --hops`
prints it.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict


def load(path: str) -> tuple[dict, dict, dict]:
    """(run -> {rank: (start, end)}, run -> StartRun time, run -> ResultArrived time)."""
    spans, sent, arrived = defaultdict(dict), {}, {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "span":
                spans[rec["run"]][rec["rank"]] = (rec["start"], rec["end"])
            elif rec.get("name") == "StartRun":
                sent[rec["run"]] = rec["t"]
            elif rec.get("name") == "ResultArrived":
                arrived[rec["run"]] = rec["t"]
    return spans, sent, arrived


def prompt_runs(sent: dict, arrived: dict) -> set[int]:
    """The prompt's runs: all go out before the first result comes back."""
    first = min(arrived.values(), default=0.0)
    return {run for run, t in sent.items() if t <= first}


def breakdown(spans: dict, sent: dict, arrived: dict, skip: int) -> dict[str, list[float]]:
    """Per labelled segment, its durations over the generated tokens' runs (seconds)."""
    out: dict[str, list[float]] = defaultdict(list)
    prompt = prompt_runs(sent, arrived)
    runs = sorted(r for r in spans if r in sent and r in arrived and r not in prompt)[skip:]
    n_ranks = max((len(spans[r]) for r in runs), default=0)
    for run in runs:
        by_rank = spans[run]
        if len(by_rank) != n_ranks:
            continue
        order = sorted(by_rank, key=lambda rank: by_rank[rank][0])
        t = sent[run]
        for rank in order:
            start, end = by_rank[rank]
            out[f"hop -> {rank}"].append(start - t)
            out[f"compute {rank}"].append(end - start)
            t = end
        out["hop -> head"].append(arrived[run] - t)
        if run + 1 in sent:
            out["head turnaround"].append(sent[run + 1] - arrived[run])
        if run + 1 in arrived:
            out["token"].append(arrived[run + 1] - arrived[run])
    return out


def report(segments: dict[str, list[float]]) -> str:
    lines = [f"{'segment':18} {'median ms':>10} {'p90 ms':>8} {'runs':>5}"]
    hops = 0.0
    for label, values in segments.items():
        values = sorted(values)
        med = statistics.median(values)
        if label.startswith("hop") or label == "head turnaround":
            hops += med
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        lines.append(f"{label:18} {med * 1e3:10.2f} {p90 * 1e3:8.2f} {len(values):5d}")
    lines.append(f"{'sum of hop medians':18} {hops * 1e3:10.2f}")
    return "\n".join(lines)


def prefill(spans: dict, sent: dict, arrived: dict) -> str:
    """Where the prompt's time went: its runs' window (the first sent to the last back) and
    each stage's busy share of it. The slowest stage's busy time is what the window would be
    if that stage never waited."""
    runs = sorted(prompt_runs(sent, arrived) & arrived.keys())
    if not runs:
        return "no prompt runs in the trace"
    t0, t1 = sent[runs[0]], arrived[runs[-1]]
    window = t1 - t0
    ranks = sorted({rank for r in runs for rank in spans.get(r, {})})
    lines = [f"prompt: {len(runs)} runs in {window:.2f} s"]
    busiest = 0.0
    for rank in ranks:
        times = [spans[r][rank][1] - spans[r][rank][0] for r in runs if rank in spans.get(r, {})]
        busy = sum(times)
        busiest = max(busiest, busy)
        lines.append(f"  stage {rank}: busy {busy:.2f} s ({busy / window:.0%}), median run "
                     f"{statistics.median(times) * 1e3:.0f} ms, first start "
                     f"{min(spans[r][rank][0] for r in runs if rank in spans[r]) - t0:.2f} s")
    lines.append(f"  the busiest stage alone: {busiest:.2f} s ({busiest / window:.0%} of the "
                 "window)")
    return "\n".join(lines)

