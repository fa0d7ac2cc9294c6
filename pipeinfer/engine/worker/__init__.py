"""A pipeline rank: core.py (the rules a rank applies to each transaction: compute, skip or
abort a run, KV operations, statistics) <- loop.py (the MPI side: receive, apply, forward;
with background.py, the refill contexts' runs computed behind the loop at the lowest
priority, and replicas.py, the copies of its KV cells kept and sent to its neighbours, and
theirs) and local.py (the same rules for stages in the head's process, without MPI)."""
