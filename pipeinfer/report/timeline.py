"""The picture of a `--trace` file: which rank computed which run when (the paper's Figs. 2-3,
from a real run).

A trace is JSON lines written by the head, in any order (workers' spans come last), every time
in seconds of the head's time.monotonic() (workers' spans already converted with their clock
offsets):

    {"t": 12.35, "rank": 0, "type": "action", "name": "StartRun", "run": 9, "speculative": true,
     "n_tokens": 4, ...}
    {"t": 12.36, "rank": 0, "type": "action", "name": "CancelRuns", "runs": [8, 9]}
    {"t": 12.37, "rank": 0, "type": "action", "name": "EmitTokens", "run": 7, "tokens": [1, 2]}
    {"t": 12.38, "rank": 0, "type": "policy", "name": "cutoff", "value": 0.35, ...}
    {"type": "span", "rank": 2, "run": 9, "start": 12.40, "end": 12.52, "outcome": "computed",
     "speculative": true, "n_tokens": 4}

Records of other types or names are skipped (the trace grows; the picture needs only these).
`draw_timeline` writes a PNG: one row per rank (the head on top), a bar per span coloured by
run kind, cancelled runs hatched, aborted ones ending where they stopped, skipped ones a tick,
the head's accepted tokens as markers, and the speculation cutoff over time when recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

OUTCOMES = ("computed", "aborted", "skipped")
COLORS = {False: "#4c72b0", True: "#dd8452"}  # non-speculative, speculative
CANCEL_EDGE = "#c44e52"
LABEL_RUNS_MAX = 40   # run ids written on the bars only up to this many runs
LABEL_GAP = 0.012     # labels need this share of the time axis to themselves


class TraceError(ValueError):
    """A trace that cannot be read; the message names the line, if one is at fault."""

    def __init__(self, line: int | None, message: str):
        super().__init__(message if line is None else f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True)
class Span:
    rank: int
    run: int
    start: float
    end: float
    outcome: str          # "computed", "aborted" or "skipped"
    speculative: bool
    n_tokens: int | None


@dataclass
class Trace:
    spans: dict[int, list[Span]] = field(default_factory=dict)  # per rank, by start time
    starts: dict[int, tuple[float, bool]] = field(default_factory=dict)  # run: (t, speculative)
    cancels: list[tuple[float, list[int]]] = field(default_factory=list)
    emits: list[tuple[float, int]] = field(default_factory=list)  # (t, tokens accepted)
    cutoff: list[tuple[float, float]] = field(default_factory=list)  # (t, value)
    t0: float = 0.0       # the first record's time: the picture's zero
    t_end: float = 0.0    # the last record's time

    @property
    def cancelled(self) -> set[int]:
        """Runs a CancelRuns action named, or that some rank aborted or skipped."""
        out = {run for _, runs in self.cancels for run in runs}
        return out | {s.run for spans in self.spans.values() for s in spans
                      if s.outcome != "computed"}

    @property
    def runs(self) -> set[int]:
        return set(self.starts) | {s.run for spans in self.spans.values() for s in spans}


# --- reading ---------------------------------------------------------------------------------
def _number(rec: dict, key: str, line: int) -> float:
    value = rec.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(line, f"{key!r} must be a number, not {value!r}")
    return float(value)


def _integer(rec: dict, key: str, line: int) -> int:
    value = rec.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(line, f"{key!r} must be an integer, not {value!r}")
    return value


def _int_list(rec: dict, key: str, line: int) -> list[int]:
    value = rec.get(key)
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int)
                                          for v in value):
        raise TraceError(line, f"{key!r} must be a list of integers, not {value!r}")
    return value


def _flag(rec: dict, key: str, line: int) -> bool | None:
    value = rec.get(key)
    if value is not None and not isinstance(value, bool):
        raise TraceError(line, f"{key!r} must be true or false, not {value!r}")
    return value


def _span(rec: dict, line: int) -> tuple[dict, float, float]:
    """A span record's fields, checked (its kind may still come from its StartRun)."""
    start, end = _number(rec, "start", line), _number(rec, "end", line)
    if end < start:
        raise TraceError(line, f"span ends ({end}) before it starts ({start})")
    outcome = rec.get("outcome", "computed")
    if outcome not in OUTCOMES:
        raise TraceError(line, f"unknown span outcome {outcome!r} (one of {', '.join(OUTCOMES)})")
    n_tokens = rec.get("n_tokens")
    fields = {"rank": _integer(rec, "rank", line), "run": _integer(rec, "run", line),
              "start": start, "end": end, "outcome": outcome,
              "speculative": _flag(rec, "speculative", line),
              "n_tokens": None if n_tokens is None else _integer(rec, "n_tokens", line)}
    return fields, start, end


def _record(trace: Trace, rec: dict, line: int, spans: list[dict]) -> list[float]:
    """Take one record into `trace` (spans into `spans`, resolved at the end); its times."""
    kind, name = rec.get("type"), rec.get("name")
    if kind == "span":
        fields, start, end = _span(rec, line)
        spans.append(fields)
        return [start, end]
    if kind not in ("event", "action", "policy"):
        return []  # an unknown kind of record: its time may not even be the head's
    t = _number(rec, "t", line)
    if kind == "action" and name == "StartRun":
        trace.starts[_integer(rec, "run", line)] = (t, bool(_flag(rec, "speculative", line)))
    elif kind == "action" and name == "CancelRuns":
        trace.cancels.append((t, _int_list(rec, "runs", line)))
    elif kind == "action" and name == "EmitTokens":
        trace.emits.append((t, len(_int_list(rec, "tokens", line))))
    elif kind == "policy" and name == "cutoff":
        trace.cutoff.append((t, _number(rec, "value", line)))
    return [t]


def read_trace(path: str | Path) -> Trace:
    """Read a trace file; TraceError ("line N: ...") on a line that is not a valid record,
    OSError if the file cannot be read."""
    trace, spans, times = Trace(), [], []
    with open(path, encoding="utf-8") as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                rec = json.loads(text)
            except ValueError as err:
                raise TraceError(line, f"not JSON ({err})") from None
            if not isinstance(rec, dict):
                raise TraceError(line, f"not a JSON object: {text.strip()[:60]}")
            times += _record(trace, rec, line, spans)
    if not times:
        raise TraceError(None, "no records: the trace is empty")
    trace.t0, trace.t_end = min(times), max(times)
    for fields in spans:
        if fields["speculative"] is None:  # the span did not say: its StartRun does
            fields["speculative"] = trace.starts.get(fields["run"], (0.0, False))[1]
        trace.spans.setdefault(fields["rank"], []).append(Span(**fields))
    for rank_spans in trace.spans.values():
        rank_spans.sort(key=lambda s: s.start)
    trace.cancels.sort()
    trace.emits.sort()
    trace.cutoff.sort()
    return trace


# --- drawing ---------------------------------------------------------------------------------
ROW_H = 0.6  # a bar's height, in rows


def draw_timeline(trace: Trace, out_png: str | Path) -> None:
    """Draw `trace` into a PNG file (matplotlib's Agg renderer, no window, no pyplot state)."""
    from matplotlib.figure import Figure

    ranks = sorted(set(trace.spans) | {0})
    rows = {rank: i for i, rank in enumerate(ranks)}
    main_h = 0.55 * len(ranks) + 0.8
    cut_h = 1.0 if trace.cutoff else 0.0
    fig = Figure(figsize=(13, main_h + cut_h + 1.3), layout="constrained")
    if trace.cutoff:
        ax, ax_cut = fig.subplots(2, 1, sharex=True,
                                  gridspec_kw={"height_ratios": [main_h, cut_h]})
    else:
        ax, ax_cut = fig.subplots(), None
    cancelled = trace.cancelled
    label = len(trace.runs) <= LABEL_RUNS_MAX
    for rank in ranks:
        _draw_spans(ax, trace, trace.spans.get(rank, []), rows[rank], cancelled, label)
    _draw_head(ax, trace, rows[0])
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels(["head (rank 0)" if r == 0 else f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.95)  # inverted: the head on top, room for token marks
    ax.set_xlim(0, max(trace.t_end - trace.t0, 1e-6) * 1.01)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    if ax_cut is not None:
        _draw_cutoff(ax_cut, trace)
    (ax_cut or ax).set_xlabel("seconds since the first record (the head's clock)")
    ax.legend(handles=_legend(trace), loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4,
              fontsize=8, frameon=False)
    fig.suptitle(_title(trace, cancelled), fontsize=11)
    fig.savefig(out_png, dpi=110)


def _title(trace: Trace, cancelled: set[int]) -> str:
    runs = trace.runs
    speculative = {s.run for spans in trace.spans.values() for s in spans if s.speculative}
    speculative |= {run for run, (_, spec) in trace.starts.items() if spec}
    accepted = sum(n for _, n in trace.emits)
    return (f"Pipeline timeline: {len(runs)} runs ({len(speculative & runs)} speculative, "
            f"{len(cancelled & runs)} cancelled), {accepted} tokens accepted")


def _draw_spans(ax, trace: Trace, spans: list[Span], y: int, cancelled: set[int],
                label: bool) -> None:
    """One rank's row: bars by (kind, cancelled), aborted ends and skipped ticks marked."""
    from matplotlib.colors import to_rgba

    groups: dict[tuple[bool, bool], list[tuple[float, float]]] = {}
    for s in spans:
        if s.outcome != "skipped":
            groups.setdefault((s.speculative, s.run in cancelled), []).append(
                (s.start - trace.t0, s.end - s.start))
    thin = len(spans) > 150  # white edges would eat thin bars
    for (speculative, was_cancelled), bars in sorted(groups.items()):
        color = COLORS[speculative]
        if was_cancelled:
            ax.broken_barh(bars, (y - ROW_H / 2, ROW_H), facecolors=to_rgba(color, 0.45),
                           edgecolor=CANCEL_EDGE, linewidth=0.6, hatch="////")
        else:
            ax.broken_barh(bars, (y - ROW_H / 2, ROW_H), facecolors=color, edgecolor="white",
                           linewidth=0 if thin else 0.4)
    aborted = [s.end - trace.t0 for s in spans if s.outcome == "aborted"]
    skipped = [s.start - trace.t0 for s in spans if s.outcome == "skipped"]
    ax.plot(aborted, [y] * len(aborted), ls="none", marker="|", ms=17, mew=2.2,
            color=CANCEL_EDGE)
    ax.plot(skipped, [y] * len(skipped), ls="none", marker="|", ms=7, mew=1.5,
            color=CANCEL_EDGE)
    if label:
        _label_runs(ax, trace, spans, y, cancelled)


def _label_runs(ax, trace: Trace, spans: list[Span], y: int, cancelled: set[int]) -> None:
    """Run ids on the bars wide enough to hold one (only drawn when there are few runs)."""
    min_w = LABEL_GAP * max(trace.t_end - trace.t0, 1e-6)
    for s in spans:
        if s.end - s.start >= min_w:
            ax.text((s.start + s.end) / 2 - trace.t0, y, str(s.run), ha="center",
                    va="center", fontsize=7, clip_on=True,
                    color="#222222" if s.run in cancelled else "white")


def _draw_head(ax, trace: Trace, y: int) -> None:
    """The head's row: runs started (ticks under it), cancellations sent, tokens accepted."""
    for speculative in (False, True):
        ts = [t - trace.t0 for t, spec in trace.starts.values() if spec == speculative]
        ax.plot(ts, [y + 0.42] * len(ts), ls="none", marker="|", ms=6, mew=1,
                color=COLORS[speculative])
    cancels = [t - trace.t0 for t, _ in trace.cancels]
    ax.plot(cancels, [y + 0.42] * len(cancels), ls="none", marker="x", ms=5, mew=1.2,
            color=CANCEL_EDGE)
    emits = [t - trace.t0 for t, _ in trace.emits]
    ax.plot(emits, [y - 0.45] * len(emits), ls="none", marker="v", ms=6, color="#222222")
    # counts over the markers only if none would run into its neighbour's
    gaps = [b - a for a, b in zip(emits, emits[1:])]
    if min(gaps, default=1.0) >= LABEL_GAP * max(trace.t_end - trace.t0, 1e-6):
        for x, (_, n) in zip(emits, trace.emits):
            ax.text(x, y - 0.62, f"+{n}", ha="center", va="bottom", fontsize=7,
                    color="#222222", clip_on=True)


def _draw_cutoff(ax, trace: Trace) -> None:
    """The speculation cutoff over time: a step plot, each value holding until the next."""
    xs = [t - trace.t0 for t, _ in trace.cutoff] + [trace.t_end - trace.t0]
    values = [v for _, v in trace.cutoff]
    ax.step(xs, values + values[-1:], where="post", color="#55a868", linewidth=1.2)
    ax.set_ylabel("cutoff", fontsize=9)
    ax.grid(alpha=0.3)
    ax.tick_params(axis="y", labelsize=8)


def _legend(trace: Trace) -> list:
    """Legend entries: the two run kinds always, the marks only when the trace has them."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def mark(marker: str, color: str, text: str, ms: float = 7, mew: float = 1.5) -> Line2D:
        return Line2D([], [], ls="none", marker=marker, color=color, ms=ms, mew=mew,
                      label=text)

    spans = [s for spans in trace.spans.values() for s in spans]
    handles = [Patch(facecolor=COLORS[False], label="non-speculative run"),
               Patch(facecolor=COLORS[True], label="speculative run")]
    if trace.cancelled:
        handles.append(Patch(facecolor="#bbbbbb", edgecolor=CANCEL_EDGE, hatch="////",
                             label="cancelled run"))
    if any(s.outcome == "aborted" for s in spans):
        handles.append(mark("|", CANCEL_EDGE, "aborted (where it stopped)", 11, 2.2))
    if any(s.outcome == "skipped" for s in spans):
        handles.append(mark("|", CANCEL_EDGE, "skipped (not computed)"))
    if trace.emits:
        handles.append(mark("v", "#222222", "tokens accepted (+count)", 6, 1))
    if trace.starts:
        handles.append(mark("|", "#777777", "run started by the head", 6, 1))
    if trace.cancels:
        handles.append(mark("x", CANCEL_EDGE, "cancellation sent", 5, 1.2))
    return handles
