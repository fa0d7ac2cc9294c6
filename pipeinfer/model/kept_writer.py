"""A thread that writes and removes a rank's kept copies of KV cells (kept_cells.py) in the
order they were asked for, so that the rank's loop does not wait for the disk: a copy is
taken from llama.cpp at once (its cells change with the next run), and its checksum, the
write and the rename happen here while the loop goes on with the next transaction (the disk
calls and the checksum release the GIL). A rank killed meanwhile loses at most the copies
still queued: the ones on disk are older and whole, and a resumed request takes the
positions every rank holds (job/restore.py)."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)


class Writer:
    def __init__(self):
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kept-writer", daemon=True)
        self._thread.start()

    def do(self, fn: Callable[..., Any], *args) -> None:
        """Run fn(*args) on the writer's thread, after everything asked before."""
        self._todo.put((fn, args))

    def flush(self) -> None:
        """Wait until everything asked so far is done."""
        done = threading.Event()
        self._todo.put((done.set, ()))
        done.wait()

    def _run(self) -> None:
        while True:
            fn, args = self._todo.get()
            try:
                fn(*args)
            except Exception:   # noqa: BLE001 (a copy is never worth a rank's life)
                log.exception("kept cells: %s failed", getattr(fn, "__name__", fn))
