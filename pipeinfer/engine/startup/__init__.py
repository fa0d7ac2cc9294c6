"""Starting a job on every rank: supervisor.py (a process per rank that names it if a signal
kills it) -> job.py (plan, obtain, load, agree; then the head's or a worker's role) with
draft_files.py (the draft models settled on rank 0), weights.py (each rank's slice, from its
cache or from rank 0) and setup.py (loading a rank's stage, the head's tokenizer, pipeline
and draft models)."""
