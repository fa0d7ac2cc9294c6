"""The files a job needs on each rank, before anything loads: draft_files.py (rank 0 settles
the draft models: resolved, checked, compacted, their vocabulary reduced) and weights.py
(each rank's slice of the target, from its stage cache or its own copy of the model, else
streamed from rank 0 over the job's transport)."""
