"""The front of `pipeinfer serve --ranks N`: a process outside MPI that owns the HTTP server
and every request's state, starts the MPI job itself and, when the job ends unexpectedly,
starts it again (without the hosts that no longer answer) and resumes every request where
it stopped, token for token (issue 32). It imports neither MPI nor llama.cpp: what needs the
model (tokenizer, chat template, grammars, the lanes) stays in the job, whose head talks to
the front over a channel (serve/front_link.py is the job's end).

main.py (start, signals, uvicorn) -> app.py (the HTTP handlers) -> table.py (the requests and
their tokens) <- channel.py (the socket to the job's head) <- supervisor.py (launch, watch,
relaunch) -> launcher.py (the mpiexec command, the hosts and their probes); report/metrics.py."""
