"""A stage that loads on a thread of its own while the job starts, for the head's draft model:
nothing needs the draft before the first draft job, and a served job relaunched after a
failure rebuilds its requests' KV cells first (no draft work meanwhile), so loading it
(seconds on a small node, weights repacked) need not hold up the start. The first use
of the stage, or of one of its slots, waits for the load; a load that failed raises its error
there."""

from __future__ import annotations

import threading
from typing import Any, Callable


class LoadingStage:
    def __init__(self, load: Callable[[], Any], name: str = "stage loading"):
        self._done = threading.Event()
        self._stage: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(load,), name=name, daemon=True)
        self._thread.start()

    def _run(self, load: Callable[[], Any]) -> None:
        try:
            self._stage = load()
        except BaseException as err:  # noqa: BLE001 (raised again where the stage is used)
            self._error = err
        finally:
            self._done.set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._stage

    def slot(self, k: int) -> "_Deferred":
        """Slot k of the stage, without waiting for it now."""
        return _Deferred(lambda: self.result().slot(k))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.result(), name)


class _Deferred:
    """An object made on its first use."""

    def __init__(self, make: Callable[[], Any]):
        self._make, self._obj = make, None

    def __getattr__(self, name: str) -> Any:
        if self._obj is None:
            self._obj = self._make()
        return getattr(self._obj, name)
