"""`pipeinfer serve`: an OpenAI-compatible HTTP server on rank 0 of one MPI job.

command.py (the options) -> service.py (one rank's part) -> http_thread.py (uvicorn on a
thread) + app.py (the ASGI app; api.py checks requests, fields.py their sampling, logprobs
and unsupported fields, errors.py the error object, text_api.py /tokenize and /detokenize,
responses.py builds answers, logprobs.py their logprobs) -> bridge.py (requests into the
head's loop, events back) -> loop.py (the head generating them up to --parallel at once on
the main thread, the only one touching MPI; stop_text.py cuts at stop strings), report/metrics.py
(Prometheus)."""
