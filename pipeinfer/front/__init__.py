"""The front of `pipeinfer serve`: the HTTP server and every request's state, outside the
MPI job's code and its imports (no MPI, no llama.cpp: what needs the model stays in the job,
whose head talks to the front over a channel; serve/link.py is the job's end).

main.py (the port, uvicorn and the job's keeper on a thread) -> app.py (the HTTP handlers,
on http.py's routes) -> table.py (the requests and their tokens) <- the job's keeper: either
supervisor.py (`serve --ranks N`: launch the job through launcher.py on the hosts of
hosts.py (after one is lost, takeover.py tells the next job where the layers were), take
its messages through channel.py, watch it with watchdog.py, relaunch it and
resume the requests) or in_job.py (the job this process is rank 0 of, no failover);
metrics.py (/metrics), trace.py (--trace, and the jobs' history) -> console.py (what the web
console shows: the job's pulses, the table's tokens, the keeper's state and history, kept
and sent to its watchers) -> page.py (the console's page and files, assets/)."""
