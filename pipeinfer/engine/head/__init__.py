"""Rank 0's loop: generate.py (a strategy's scheduler with its draft executor) -> driver.py
(the one loop: poll, step the scheduler, carry out its actions) -> pipeline.py (the target
pipeline as the scheduler sees it: embed, the head's own layers, the transport); lanes.py
(several generations through one pipeline, each in a slot: lane.py) with prompt_cache.py
(what a slot keeps), kept.py (which requests' cells the ranks copy to disk, and when),
refill.py (an answer evaluated again as prompt, along its generation or in an idle slot)
and embedding_job.py (embedding requests), both lane_job.py's; trace.py (--trace)."""
