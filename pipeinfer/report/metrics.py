"""A run's results as a CSV row (DESIGN.md section 6), and a process's resident memory."""

from __future__ import annotations

import csv
import os
import resource
from dataclasses import asdict, dataclass, fields
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
