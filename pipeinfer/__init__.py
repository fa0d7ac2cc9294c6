"""pipeinfer: asynchronous pipelined speculation for GGUF models on CPU clusters with MPI.

The packages, from the command line down (each imports only those below it; the contracts in
pyproject.toml check it):

cli/ (the `pipeinfer` command) -> serve/ (the job's side of `serve`) and front/ (its HTTP
side: the request table, the supervisor that relaunches the job) -> job/ (a job on every
rank: start-up, the head's and the workers' roles) -> plan/ (splits, costs, calibration,
the simulator) -> engine/ (files, head, drafting, worker, transport) -> report/ (results,
CSV rows, timelines) -> config/ (the typed configuration) -> api/ (the OpenAI surface as
data) -> strategies/ (the one table of strategies) -> schedule/ (the pure scheduler core)
and model/ (GGUF files, slices and llama.cpp)."""

__version__ = "0.1.0"
