"""The job's side of `pipeinfer serve`, on rank 0 (the HTTP side is pipeinfer/front/):

service.py (one rank's part: the channel to the front, the job, the endings) -> link.py (the
channel) -> intake.py (the front's messages: requests parsed and checked with the model;
prepare.py renders and tokenizes them into tickets, tool_formats.py the model's tool-call
format) -> bridge.py (tickets into the head's loop) -> loop.py (the head generating them, up
to --parallel at once on the main thread, the only one touching MPI; stop_text.py cuts at
stop strings; pulse.py measures the ranks once a second) -> events, totals and pulses back
through the link; stats.py (what the job counts for /metrics and the console)."""
