"""The configuration of a job, built once from the command line and shared by every rank and
layer: job.py (JobConfig: the job every rank runs, its checks, what follows from them) with
the speculation's knobs (schedule/options.SpecOptions), drafts.py (--draft-source and
--draft-vocab settled), run.py (`run`'s own request and output) and serving.py (`serve`'s
HTTP side and request defaults). Defaults live here, once; the command line's options take
them from these classes."""
