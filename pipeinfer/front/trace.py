"""`pipeinfer serve --ranks N --trace FILE`: the front's record of its jobs, one JSON line per
event, written (and flushed) as it happens, so a front killed outright leaves every line
before it:

    {"t": 812.4, "time": 1764143000.1, "type": "front", "name": "job_start", "job": 2,
     "ranks": 3, "hosts": ["node0", "node1", "node3"]}
    {..., "name": "job_ready", "job": 2, "ranks": [{"rank": 0, "host": "a", "pid": 7}, ...]}
    {..., "name": "job_end", "job": 1, "reason": "no progress for 60 s ...", "ready": true,
     "failed_rank": 1, "planned": false, "returncode": -9}
    {..., "name": "stall", "job": 1, "quiet_s": 60.2, "requests": 4, "calls": 0,
     "stopped": [[1, 4242]]}
    {..., "name": "resume", "job": 2, "request": 17, "kind": "completions",
     "tokens": [12, 12], "sent": 24}
    {..., "name": "recovered", "job": 2, "seconds": 4.5, "requests": 4}
    {..., "name": "host_left", "host": "node2", "why": "does not answer"}
    {..., "name": "host_back", "hosts": ["node2"]}
    {..., "name": "give_up", "reason": "..."}

`t` is seconds of the front's time.monotonic() (as `pipeinfer run --trace`'s records, whose
reader, report/timeline.py, skips records of this type), `time` the wall clock (Unix seconds). A
job's end says why (its head's message, the rank-failure line, the watchdog's "no progress"
or the launcher's status), `failed_rank` the rank blamed if any; `resume` names each request
sent again to a new job and the tokens each of its choices had sent; `recovered` the time from
the failure noticed to the new job taking requests."""

from __future__ import annotations

import json
import time
from typing import IO, Callable


class FrontTrace:
    """The record of the jobs, to the --trace file if one is given, and to `also` (the
    console's history: console.py) whether or not."""

    def __init__(self, path: str | None, also: Callable[[str, dict], None] | None = None):
        self._file: IO[str] | None = (open(path, "w", encoding="utf-8", buffering=1)
                                      if path else None)
        self.also = also

    def record(self, name: str, **fields) -> None:
        if self.also is not None:
            self.also(name, fields)
        if self._file is None:
            return
        line = {"t": round(time.monotonic(), 4), "time": round(time.time(), 3),
                "type": "front", "name": name, **fields}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
