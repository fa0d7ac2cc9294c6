"""The timeline picture of a `--trace` file (issue 18 item 6): pipeinfer/report/timeline.py and
`plot.py --timeline TRACE --out DIR`, on a small synthetic trace over 3 ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeinfer.report.timeline import Span, TraceError, draw_timeline, read_trace

ROOT = Path(__file__).resolve().parent.parent
PLOT = ROOT / "plot.py"
T0 = 1000.0  # the head's monotonic clock is not 0 at the start


def pipeline_records(runs, stage_s=(0.04, 0.1, 0.1)) -> list[dict]:
    """Head actions and per-rank spans of `runs` [(run, start, speculative, n_tokens,
    {rank: outcome})] through a pipeline whose ranks take `stage_s` each (outcome "computed"
    unless named; an aborted span stops halfway, a skipped one has zero length)."""
    records, free = [], [T0] * len(stage_s)
    for run, start, speculative, n_tokens, outcomes in runs:
        records.append({"t": start, "rank": 0, "type": "action", "name": "StartRun", "run": run,
                        "speculative": speculative, "n_tokens": n_tokens,
                        "positions": list(range(n_tokens))})
        ready = start
        for rank, cost in enumerate(stage_s):
            outcome = outcomes.get(rank, "computed")
            begin = max(ready, free[rank])
            end = begin + {"computed": cost, "aborted": cost / 2, "skipped": 0.0}[outcome]
            free[rank] = ready = end
            span = {"type": "span", "rank": rank, "run": run, "start": begin, "end": end,
                    "outcome": outcome, "n_tokens": n_tokens}
            if rank:  # the head's own spans leave the kind to the run's StartRun
                span["speculative"] = speculative
            records.append(span)
    return records


def synthetic_trace() -> list[dict]:
    runs = [(0, T0, False, 1, {}), (1, T0 + 0.05, True, 4, {}), (2, T0 + 0.1, True, 3, {}),
            (3, T0 + 0.15, True, 4, {1: "aborted", 2: "skipped"}),
            (4, T0 + 0.3, False, 1, {})]
    records = pipeline_records(runs)
    records += [
        {"t": T0 + 0.25, "rank": 0, "type": "event", "name": "ResultArrived", "run": 0},
        {"t": T0 + 0.251, "rank": 0, "type": "action", "name": "EmitTokens", "run": 0,
         "tokens": [11]},
        {"t": T0 + 0.35, "rank": 0, "type": "action", "name": "EmitTokens", "run": 1,
         "tokens": [12, 13, 14]},
        {"t": T0 + 0.36, "rank": 0, "type": "action", "name": "CancelRuns", "runs": [3]},
        {"t": T0 + 0.37, "rank": 0, "type": "action", "name": "SomethingNew", "x": 1},
        {"t": T0, "rank": 0, "type": "policy", "name": "cutoff", "value": 0.5, "why": "start"},
        {"t": T0 + 0.1, "rank": 0, "type": "policy", "name": "cutoff", "value": 0.6},
        {"t": T0 + 0.36, "rank": 0, "type": "policy", "name": "cutoff", "value": 0.4},
        {"type": "mystery", "stuff": [1, 2]},
    ]
    # the head writes workers' spans at the end: put them last, the rest in time order
    head = sorted((r for r in records if r.get("rank") == 0 or r["type"] != "span"),
                  key=lambda r: r.get("t", r.get("start", 0.0)))
    return head + [r for r in records if r["type"] == "span" and r["rank"] != 0]


def write_trace(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def run_plot(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PLOT), *map(str, args)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_read_trace_spans_per_rank(tmp_path):
    trace = read_trace(write_trace(tmp_path / "t.jsonl", synthetic_trace()))
    assert sorted(trace.spans) == [0, 1, 2]
    assert [s.run for s in trace.spans[1]] == [0, 1, 2, 3, 4]
    head_spec = {s.run: s.speculative for s in trace.spans[0]}
    assert head_spec == {0: False, 1: True, 2: True, 3: True, 4: False}  # from StartRun
    aborted = [s for s in trace.spans[1] if s.run == 3][0]
    assert aborted.outcome == "aborted" and aborted.speculative and aborted.n_tokens == 4
    skipped = [s for s in trace.spans[2] if s.run == 3][0]
    assert skipped.outcome == "skipped" and skipped.start == skipped.end
    assert all(isinstance(s, Span) for spans in trace.spans.values() for s in spans)
    assert all(a.start <= b.start for spans in trace.spans.values()
               for a, b in zip(spans, spans[1:]))
    assert trace.cancelled == {3}
    assert [n for _, n in trace.emits] == [1, 3]
    assert [v for _, v in trace.cutoff] == [0.5, 0.6, 0.4]
    assert trace.t0 == T0
    assert trace.runs == {0, 1, 2, 3, 4}


def test_plot_timeline_writes_png(tmp_path):
    trace = write_trace(tmp_path / "t.jsonl", synthetic_trace())
    result = run_plot("--timeline", trace, "--out", tmp_path / "figs")
    assert result.returncode == 0, result.stderr
    png = tmp_path / "figs" / "timeline.png"
    assert png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in result.stdout


@pytest.mark.slow
def test_many_runs_draw(tmp_path):
    """A few hundred runs: thin bars, no labels, still one picture (and quickly)."""
    runs = [(i, T0 + 0.03 * i, i % 4 != 0, 1 + i % 4, {2: "skipped"} if i % 7 == 3 else {})
            for i in range(300)]
    trace = read_trace(write_trace(tmp_path / "t.jsonl", pipeline_records(runs)))
    assert trace.cutoff == [] and len(trace.spans[2]) == 300
    draw_timeline(trace, tmp_path / "many.png")
    assert (tmp_path / "many.png").stat().st_size > 1000


@pytest.mark.parametrize("bad, message", [
    ("{not json", "line 3: not JSON"),
    ('{"type": "span", "rank": 1, "run": 2, "start": "soon", "end": 1.0}',
     "line 3: 'start' must be a number"),
    ('{"type": "action", "name": "CancelRuns", "t": 1.0, "runs": 3}',
     "line 3: 'runs' must be a list of integers"),
    ("[1, 2]", "line 3: not a JSON object"),
])
def test_malformed_line_is_one_message(tmp_path, bad, message):
    good = [json.dumps(r) for r in synthetic_trace()[:2]]
    trace = tmp_path / "bad.jsonl"
    trace.write_text("\n".join(good + [bad] + good) + "\n")
    with pytest.raises(TraceError, match=message):
        read_trace(trace)
    result = run_plot("--timeline", trace, "--out", tmp_path / "figs")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("plot.py: error: ")
    assert message in lines[0] and str(trace) in lines[0]
    assert not (tmp_path / "figs" / "timeline.png").exists()


def test_empty_or_missing_trace(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    for path, message in ((tmp_path / "empty.jsonl", "empty"),
                          (tmp_path / "missing.jsonl", "missing.jsonl")):
        result = run_plot("--timeline", path, "--out", tmp_path / "figs")
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert message in result.stderr


def test_plot_needs_csv_or_timeline(tmp_path):
    result = run_plot("--out", tmp_path / "figs")
    assert result.returncode == 2 and "Traceback" not in result.stderr
