"""The OpenAI-compatible API as data, without HTTP, MPI or llama.cpp: what the front and the
job's head say to each other about a request.

requests.py (a JSON body into a checked Ask; fields.py its sampling, logprobs and the fields
not supported; errors.py the error object; tool_calls.py tools and tool_choice) ->
text.py (/tokenize and /detokenize bodies), embeddings.py (/v1/embeddings) -> the job
answers with events.py -> responses.py (answers and stream chunks; logprobs.py their logprobs;
tool_calls.py with hermes_calls.py, call_stream.py and json_scan.py the calls in an answer)."""
