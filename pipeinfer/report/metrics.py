"""Timing and counters of one generation, and the CSV row it becomes (DESIGN.md section 6)."""

from __future__ import annotations

import csv
import os
import resource
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


def rss_mb() -> float:
    """Resident set size of this process now, in MB (Linux; 0 where unknown)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        return 0.0


def peak_rss_mb() -> float:
    """The most resident memory this process has had so far, in MB (Linux: ru_maxrss in kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Timeline:
    """Wall-clock marks of one generation (time.perf_counter seconds)."""
    start: float = 0.0
    prefill_done: float = 0.0            # first logits back: the end of prefill
    accepted: list[float] = field(default_factory=list)  # one mark per generated token

    def mark_token(self, count: int = 1) -> None:
        now = time.perf_counter()
        self.accepted.extend([now] * count)

    @property
    def prefill_s(self) -> float:
        return self.prefill_done - self.start

    @property
    def ttft_s(self) -> float | None:
        """End of prefill to the first accepted token not sampled from the prefill logits."""
        return self.accepted[1] - self.prefill_done if len(self.accepted) > 1 else None

    @property
    def gen_s(self) -> float:
        return (self.accepted[-1] - self.prefill_done) if self.accepted else 0.0

    @property
    def speed_tps(self) -> float | None:
        """Tokens generated after the first (which costs nothing after prefill) per second."""
        n = len(self.accepted) - 1
        return n / self.gen_s if n > 0 and self.gen_s > 0 else None

    @property
    def itl_s(self) -> float | None:
        n = len(self.accepted) - 1
        return (self.accepted[-1] - self.accepted[0]) / n if n > 0 else None


@dataclass
class Counters:
    """Speculation counters (zero for strategies that do not speculate)."""
    n_drafted: int = 0
    n_accepted: int = 0
    n_unverified: int = 0        # drafted tokens of runs dropped (cancelled) before verification
    n_drafted_ngram: int = 0     # of n_drafted, tokens drafted by n-gram lookup (the rest: model)
    n_accepted_ngram: int = 0    # of n_accepted, ... of those
    n_drafted_free: int = 0      # tokens a grammar forced, drafted without a draft-model step
    n_drafts_cut: int = 0        # drafted tokens a grammar forbade, cut before being sent
    runs_started: int = 0
    runs_speculative: int = 0
    runs_cancelled_superfluous: int = 0
    runs_cancelled_invalidated: int = 0
    runs_aborted_midway: int = 0
    microbatch_tokens: int = 0
    tree_steps: int = 0          # specpipe: target tokens verified against the tree
    tree_hits: int = 0           # specpipe: ... that were in it (the tree was rerooted)
    flushes: int = 0             # specpipe: pipeline flushes (misses)
    tree_nodes: int = 0          # specpipe: speculative tree nodes summed over steps

    @property
    def hit_rate(self) -> float | None:
        return self.tree_hits / self.tree_steps if self.tree_steps else None

    @property
    def mean_tree_size(self) -> float | None:
        return self.tree_nodes / self.tree_steps if self.tree_steps else None

    @property
    def accept_rate(self) -> float | None:
        """Share of the drafted tokens that were accepted (tokens of cancelled runs count as
        not accepted: they cost drafting and pipeline time)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else None

    @property
    def verified_accept_rate(self) -> float | None:
        """Share of the drafted tokens the target verified that it accepted: the draft's
        alignment as verification saw it (equals accept_rate when nothing was cancelled)."""
        verified = self.n_drafted - self.n_unverified
        return self.n_accepted / verified if verified > 0 else None

    @property
    def mean_microbatch(self) -> float | None:
        return self.microbatch_tokens / self.runs_speculative if self.runs_speculative else None


@dataclass
class CsvRow:
    time: str
    strategy: str
    target: str
    draft: str
    ranks: int
    split: str
    threads: str
    n_prompt: int
    n_generated: int
    prefill_tps: float | None
    speed_tps: float | None
    itl_s: float | None
    ttft_s: float | None
    accept_rate: float | None
    n_drafted: int = 0
    n_accepted: int = 0
    runs_started: int = 0
    runs_speculative: int = 0
    runs_cancelled_superfluous: int = 0
    runs_cancelled_invalidated: int = 0
    runs_aborted_midway: int = 0
    mean_microbatch: float | None = None
    busy_fraction: str = ""
    label: str = ""
    hit_rate: float | None = None        # specpipe
    flushes: int = 0                     # specpipe
    mean_tree_size: float | None = None  # specpipe
    n_unverified: int = 0
    verified_accept_rate: float | None = None
    draft_source: str = ""               # model, ngram or both (speculating strategies)
    n_drafted_ngram: int = 0             # of n_drafted: by n-gram lookup
    n_accepted_ngram: int = 0            # of n_accepted: ... of those
    peak_rss_mb: str = ""                # per rank (node), rank 0 first, comma-separated
    error: str = ""                      # experiments: why a run has no figures
    compact_draft: bool | None = None    # the draft loaded as its Q4_0 copy (None: no draft)
    draft_vocab: int | None = None       # the draft's K kept tokens (0: all; None: no draft)


def append_csv(path: str | os.PathLike, row: CsvRow) -> None:
    """Append one row, writing the header when the file is new or empty. A file written by an
    older version (fewer columns) first gets the new columns added, empty in its old rows, so
    every row stays aligned with the header."""
    path = Path(path)
    names = [f.name for f in fields(CsvRow)]
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        with open(path, newline="") as handle:
            existing = next(csv.reader(handle), [])
        missing = [n for n in names if n not in existing]
        if missing:
            _add_columns(path, existing + missing)
        names = existing + missing
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=names, restval="", extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})


def _add_columns(path: Path, header: list[str]) -> None:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, restval="")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
