"""From `pipeinfer serve --ranks N ...` to the front's options: the hosts, and the command
line of the job (the user's options less the front's own, which the job does not take)."""

from __future__ import annotations

import sys

from .main import Failure
from ..front.launcher import LaunchError, parse_host, read_hostfile, strip_options
from ..front.main import FrontOptions, main

# The front's own options, each with a value: the job gets every other option as given.
FRONT_ONLY = ("--ranks", "--hostfile", "--hosts", "--mpiexec", "--max-restarts", "--host",
              "--port", "--api-key", "--cors-origin", "--queue", "--channel", "--stall-timeout",
              "--trace")
JOB_QUEUE = 4096   # the front holds the waiting requests (its --queue); the job takes them all


def run_front(ranks, hostfile, host_list, mpiexec, max_restarts, host, port, queue, api_key,
              model_name, cors_origins, slots, stall_timeout, trace) -> int:
    if hostfile and host_list:
        raise Failure("give --hostfile or --hosts, not both", 2)
    try:
        hosts = (read_hostfile(hostfile) if hostfile else
                 [parse_host(h) for h in host_list.split(",") if h.strip()] if host_list
                 else None)
    except LaunchError as err:
        raise Failure(str(err), 2) from None
    options = FrontOptions(ranks, tuple(hosts) if hosts else None, mpiexec, max_restarts,
                           tuple(job_args(sys.argv)), host, port, queue, api_key, model_name,
                           tuple(cors_origins) or ("*",), slots, stall_timeout, trace)
    return main(options)


def job_args(argv: list[str]) -> list[str]:
    """The options after `serve` in `argv`, less FRONT_ONLY ones (`--opt value` or
    `--opt=value`), with the job's queue."""
    args = argv[argv.index("serve") + 1:] if "serve" in argv else argv[1:]
    return strip_options(args, FRONT_ONLY) + ["--queue", str(JOB_QUEUE)]
