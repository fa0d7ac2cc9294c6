"""Messages between the ranks of a job: mpi.py (the only module that imports mpi4py: links,
the head's and the workers' transports; wire.py their format), with wakeup.py and
wakeup_net.py (waking a rank that waits, without spinning) and backoff.py (polite polling);
clock_sync.py (the ranks' clocks, for traces), transfer.py (a file from rank 0 to another
rank), draft_link.py (PipeSpec's draft ranks)."""
