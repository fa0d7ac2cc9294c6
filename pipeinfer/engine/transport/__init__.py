"""Messages between the ranks of a job: mpi.py (the only module that imports mpi4py: a rank's
link, errors and aborts), head_transport.py (the head's side of the pipeline: transactions
out, results back) and worker_link.py (a worker's: from the previous rank to the next),
wire.py their format; with wakeup.py and wakeup_net.py (waking a rank that waits, without
spinning) and backoff.py (polite polling); clock_sync.py (the ranks' clocks, for traces),
transfer.py (a file from rank 0 to another rank), draft_link.py (PipeSpec's draft ranks)."""
