"""Rank 0's loop: generate.py (a strategy's scheduler with its draft executor) -> driver.py
(the one loop: poll, step the scheduler, carry out its actions) -> pipeline.py (the target
pipeline as the scheduler sees it: embed, the head's own layers, the transport); lanes.py
(several generations through one pipeline, each in a slot) with prompt_cache.py (what a
slot keeps) and embedding_job.py (embedding requests); trace.py (--trace)."""
