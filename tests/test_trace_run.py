"""`pipeinfer run --trace` end to end, under real mpiexec: the head's events and actions, the
cutoff's moves and every rank's stage spans land in one file in the head's clock, agree with
the generation, and `plot.py --timeline` draws them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.mpi_util import run_pipeinfer

ROOT = Path(__file__).resolve().parent.parent
N_PREDICT = 24


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, ranks", [("pipeinfer", 3), ("iterative", 2),
                                             ("specpipe", 3), ("pipespec", 3)])
def test_trace_of_a_real_run(tiny_model, tiny_draft_aligned, tmp_path, strategy, ranks):
    trace = tmp_path / "trace.jsonl"
    draft = () if strategy == "iterative" else ("-md", str(tiny_draft_aligned))
    res = run_pipeinfer(ranks, tiny_model, "def main():", "--ignore-eos", "--strategy",
                        strategy, *draft, "--trace", str(trace), n_predict=N_PREDICT,
                        timeout=120)
    assert res.rc == 0 and res.json is not None, res.describe()
    records = _records(trace)
    kinds = {r["type"] for r in records}
    assert {"event", "action", "span"} <= kinds
    # tokens: what EmitTokens says is what the run generated, in order
    emitted = [t for r in records if r.get("name") == "EmitTokens" for t in r["tokens"]]
    assert emitted == res.json["tokens"]
    # every run the head started was seen by every worker, inside the head's time window
    started = {r["run"] for r in records if r.get("name") == "StartRun"}
    head_times = [r["t"] for r in records if "t" in r]
    t0, t1 = min(head_times), max(head_times)
    for rank in range(1, ranks):
        spans = [r for r in records if r["type"] == "span" and r["rank"] == rank]
        assert {s["run"] for s in spans} == started
        for s in spans:
            assert s["outcome"] in ("computed", "aborted", "skipped")
            assert t0 - 0.05 <= s["start"] <= s["end"] <= t1 + 0.05, s
    assert [r for r in records if r.get("name") == "Finish"]
    if strategy == "pipeinfer":
        # each speculative run started moves the cutoff up (p_recovery), and the trace says
        # so; how many start depends on the machine's load, so this holds for whatever ran
        spec_runs = [r for r in records if r.get("name") == "StartRun" and r["speculative"]]
        moves = [r for r in records if r["type"] == "policy" and r["name"] == "cutoff"
                 and r["why"] == "speculative run started"]
        assert len(moves) == len(spec_runs), (len(moves), len(spec_runs))
    if strategy == "iterative":
        _hops_are_read_from_it(trace, ranks)
    out = tmp_path / "figures"
    plot = subprocess.run([sys.executable, str(ROOT / "plot.py"), "--timeline", str(trace),
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    assert (out / "timeline.png").stat().st_size > 10_000


def _hops_are_read_from_it(trace: Path, ranks: int) -> None:
    """`bench_stage.py --hops` reads the cost per hop of the same trace: every stage's hop
    and compute, the way back to the head, and non-negative medians."""
    hops = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_stage.py"),
                           "--hops", str(trace), "--skip", "1"],
                          capture_output=True, text=True, timeout=60)
    assert hops.returncode == 0, hops.stderr
    rows = {line[:18].strip(): line[18:].split() for line in hops.stdout.splitlines()[1:]}
    for rank in range(1, ranks):
        assert f"hop -> {rank}" in rows and f"compute {rank}" in rows, hops.stdout
    assert "hop -> head" in rows and "sum of hop medians" in rows, hops.stdout
    assert float(rows[f"compute {ranks - 1}"][0]) > 0, hops.stdout
    assert "prompt: 1 runs" in hops.stdout and "stage 1: busy" in hops.stdout, hops.stdout
