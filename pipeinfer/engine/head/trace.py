"""`--trace FILE`: one JSON line per event, action and stage span, for timelines (a Tick, the
driver's "nothing new", is written only when the scheduler did something on it: an idle head
ticks thousands of times a second).

Times are seconds of the head's time.monotonic() clock; spans of other ranks are converted
to it with the offsets measured at start-up. pipeinfer/report/timeline.py reads and draws the file.
"""

from __future__ import annotations

import json
import time
from typing import IO

from ...schedule import actions as A
from ...schedule import events as E


def _fields(record) -> dict:
    """What a record says, beyond its name, in plain JSON values."""
    if isinstance(record, A.StartRun):
        tx = record.tx
        return {"run": tx.run_id, "speculative": tx.speculative, "n_tokens": tx.n_tokens,
                "positions": [min(tx.positions), max(tx.positions)]}
    if isinstance(record, A.CancelRuns):
        return {"runs": list(record.run_ids)}
    if isinstance(record, A.EmitTokens):
        return {"run": record.run_id, "tokens": list(record.tokens)}
    if isinstance(record, A.StartDraft):
        job = record.job
        return {"job": job.job_id, "cutoff": round(job.cutoff, 6), "budget": job.budget,
                "context": len(job.context)}
    if isinstance(record, (A.StopDraft, E.DraftReady, E.DraftInterrupted)):
        return {"job": record.job_id}
    if isinstance(record, E.ResultArrived):
        return {"run": record.run_id}
    if isinstance(record, A.Finish):
        return {"reason": record.reason}
    return {}


class Trace:
    def __init__(self, path: str):
        self._file: IO[str] = open(path, "w", encoding="utf-8")

    def _write(self, obj: dict) -> None:
        self._file.write(json.dumps(obj, separators=(",", ":")) + "\n")

    def record(self, kind: str, record) -> None:
        """An event or action of the head's scheduler."""
        if isinstance(record, A.PolicyChanged):
            self._write({"t": time.monotonic(), "rank": 0, "type": "policy",
                         "name": record.name, "value": round(record.value, 6),
                         "why": record.why})
            return
        self._write({"t": time.monotonic(), "rank": 0, "type": kind,
                     "name": type(record).__name__, **_fields(record), "repr": repr(record)})

    def span(self, rank: int, run: int, start: float, end: float, outcome: str,
             speculative: bool, n_tokens: int) -> None:
        self._write({"type": "span", "rank": rank, "run": run, "start": start, "end": end,
                     "outcome": outcome, "speculative": speculative, "n_tokens": n_tokens})

    def rank_spans(self, rank: int, spans, offset: float) -> None:
        """A worker's spans ([run, start, end, outcome, n_tokens, speculative] in its own
        clock), moved to the head's clock by subtracting `offset`."""
        for run, start, end, outcome, n_tokens, speculative in spans:
            self.span(rank, run, start - offset, end - offset, outcome, speculative, n_tokens)

    def close(self) -> None:
        self._file.close()
