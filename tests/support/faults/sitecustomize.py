"""Faults injected into the pipeinfer processes a test launches: this directory on their
PYTHONPATH makes `site` import this module at start-up, and the variables below (read here,
never by pipeinfer) say which fault, where.

    PIPEINFER_TEST_FAULT=kind:rank:n   on rank `rank`: "decode" fails after n decodes, "load"
                                       fails loading the stage, "stats" fails at shutdown
    TEST_CORRUPT_CHUNK=i[:k]           rank 0 flips a byte of weights chunk i in its first k
                                       transfers (1), so the receiver discards the file
    TEST_CHUNK_DELAY=s                 rank 0 waits s seconds before reading each chunk
    TEST_READ_FAIL_CHUNK=i             rank 0 cannot read chunk i (its disk failing)
"""

import os
import time


def _rank() -> str:
    return os.environ.get("PMI_RANK", "0")


def _stage_faults(kind: str, n: int) -> None:
    from pipeinfer.engine.transport import worker_link
    from pipeinfer.model import stage

    if kind == "decode":
        original, calls = stage.Stage.decode, [0]

        def decode(self, *args, **kwargs):
            calls[0] += 1
            if calls[0] > n:
                raise RuntimeError("injected fault in decode")
            return original(self, *args, **kwargs)

        stage.Stage.decode = decode
    elif kind == "load":
        def load(self, *args, **kwargs):
            raise RuntimeError("injected fault in stage load")

        stage.Stage.__init__ = load
    elif kind == "stats":
        def send_stats(self, stats):
            raise RuntimeError("injected fault in shutdown")

        worker_link.WorkerLink.send_stats = send_stats


class _Unreadable:
    """The file rank 0 reads weights from, failing from now on (its other methods work)."""

    def __init__(self, file):
        self.file = file

    def read(self, n):
        raise OSError(5, "Input/output error (injected)")

    def __getattr__(self, name):
        return getattr(self.file, name)


def _transfer_faults() -> None:
    from pipeinfer.engine.transport import transfer

    corrupt, _, times = os.environ.get("TEST_CORRUPT_CHUNK", "").partition(":")
    left = [int(times) if times else 1] if corrupt else [0]
    delay = float(os.environ.get("TEST_CHUNK_DELAY") or 0)
    fail = os.environ.get("TEST_READ_FAIL_CHUNK")
    original = transfer.Sender._read

    def read(self, n):
        if delay:
            time.sleep(delay)
        if fail is not None and self._next == int(fail) and self._file is not None:
            self._file = _Unreadable(self._file)
        buf = original(self, n)
        if corrupt and self._next == int(corrupt) and left[0] > 0:
            left[0] -= 1
            buf[0] ^= 0xFF
        return buf

    transfer.Sender._read = read


_spec = os.environ.get("PIPEINFER_TEST_FAULT")
if _spec:
    _kind, _where, _n = _spec.split(":")
    if _rank() == _where:
        _stage_faults(_kind, int(_n))
if _rank() == "0" and any(os.environ.get(v) for v in ("TEST_CORRUPT_CHUNK", "TEST_CHUNK_DELAY",
                                                      "TEST_READ_FAIL_CHUNK")):
    _transfer_faults()
