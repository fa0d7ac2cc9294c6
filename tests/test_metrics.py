"""The results CSV: rows stay aligned with the header across versions that add columns."""

from __future__ import annotations

import csv
from dataclasses import fields

from pipeinfer.report.metrics import CsvRow, append_csv


def _row(**kw) -> CsvRow:
    base = dict(time="t", strategy="iterative", target="m.gguf", draft="", ranks=2, split="0,1",
                threads="1", n_prompt=5, n_generated=7, prefill_tps=1.0, speed_tps=2.0,
                itl_s=0.5, ttft_s=0.1, accept_rate=None)
    return CsvRow(**{**base, **kw})


def test_header_once_then_rows(tmp_path):
    path = tmp_path / "r.csv"
    append_csv(path, _row(label="a"))
    append_csv(path, _row(label="b"))
    rows = list(csv.DictReader(open(path)))
    assert [r["label"] for r in rows] == ["a", "b"]
    assert open(path).read().count("strategy") == 1


def test_older_file_gets_the_new_columns(tmp_path):
    path = tmp_path / "old.csv"
    names = [f.name for f in fields(CsvRow)]
    old = names[:10] + ["column_of_an_older_version"]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(old)
        writer.writerow([f"v{i}" for i in range(len(old))])
    append_csv(path, _row(label="new"))
    with open(path, newline="") as handle:
        lines = list(csv.reader(handle))
    header, first, second = lines
    assert header[:len(old)] == old and set(names) <= set(header)
    assert len(first) == len(second) == len(header)
    assert first[:len(old)] == [f"v{i}" for i in range(len(old))]
    assert dict(zip(header, second))["label"] == "new"
    assert dict(zip(header, second))["column_of_an_older_version"] == ""
