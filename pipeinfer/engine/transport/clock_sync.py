"""The head's measure of every other rank's clock (time.monotonic() is unrelated across
hosts), for traces: per rank, ping-pongs over MPI (through mpi.Link), the round with the
shortest round trip giving the estimate."""

from __future__ import annotations

import time

import numpy as np

from .backoff import Backoff
from .wire import HEAD, Tag

CLOCK_ROUNDS = 8   # ping-pongs per rank

# The waits' ceiling, short so that a sleep adds little to the round trip it is part of. A rank
# waiting for its first ping (other ranks' turns) sleeps longer, not to take their cores.
CLOCK_WAIT_S = 50e-6
CLOCK_IDLE_WAIT_S = 2e-3


def mpi_now() -> float:
    """The clock the trace uses (a function of its own so a test can skew one rank's)."""
    return time.monotonic()


def clock_offsets(link, rounds: int = CLOCK_ROUNDS) -> dict[int, float] | None:
    """Collective, called once by every rank of the communicator at the same point: the head
    measures each other rank's time.monotonic() offset against its own. On the head
    {rank: offset}, a time t of that rank being t - offset in the head's clock; None on the
    other ranks.

    Per rank, `rounds` ping-pongs: the head reads t0, pings, the rank answers with its clock,
    the head reads t1. A reply read at the midpoint is off by at most half the round trip, so
    the round with the shortest one gives the estimate (the first round may include the wait
    for a rank still starting up: ask for 2 or more)."""
    if rounds < 1:
        raise ValueError(f"clock_offsets: rounds must be at least 1, not {rounds}")
    if link.rank != HEAD:
        for i in range(rounds):
            _clock_recv(link, HEAD, CLOCK_WAIT_S if i else CLOCK_IDLE_WAIT_S)
            link.isend(np.array([mpi_now()]), HEAD, Tag.CLOCK)
        link.flush()
        return None
    offsets = {}
    for rank in range(1, link.size):
        best_rtt, offset = float("inf"), 0.0
        for i in range(rounds):
            t0 = mpi_now()
            link.isend(np.array([float(i)]), rank, Tag.CLOCK)
            remote = float(_clock_recv(link, rank, CLOCK_WAIT_S)[0])
            t1 = mpi_now()
            if t1 - t0 < best_rtt:
                best_rtt, offset = t1 - t0, remote - (t0 + t1) / 2
        offsets[rank] = offset
    link.flush()
    return offsets


def _clock_recv(link, source: int, limit: float) -> np.ndarray:
    """One float64 clock message, waited for with short sleeps (never a spinning MPI wait);
    the head watches for failure reports meanwhile, as a rank that failed never answers."""
    backoff = Backoff(first=5e-6, limit=limit)
    while (buf := link.recv_array(source, Tag.CLOCK, np.float64, wait=False)) is None:
        if link.rank == HEAD:
            link.check_errors()
        backoff.wait()
    return buf
