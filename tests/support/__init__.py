"""Code the tests share (not tests themselves; test modules import nothing from each other),
imported as `support.<module>` (tests/ is on sys.path through pytest's rootdir insertion).

Launching: mpi_util (`pipeinfer run` and any command under mpiexec, killed on timeout) ->
serving (`pipeinfer serve` as users launch it: the front or a job serving from rank 0) ->
failover (streams under way while a rank is killed); cluster (whether the emulated cluster
can run here); jobs/ (scripts run under mpiexec); faults/ (faults injected into launched
processes, through fault_env below).

What pipeinfer must answer: llama_oracle (single-node llama.cpp: greedy, sampler chains,
logprobs, chat prompts, hidden states) -> serve_oracle (the same as a server answers);
ngram_runs and reduced_drafts (the n-gram and reduced-draft exactness runs' settings);
cached_models (models used only when cached).

Models: tinymodel (tiny random-weight GGUF files llama.cpp loads, written on the spot).

In-process pipelines: tiny_set (tiny models, their slices and greedy reference) -> rig (a
strategy on real stages in one process) <- stepped_transport (worker stages with scripted
timing, on the worker's own StageCore) and scripted_draft (drafts that follow a script);
schedule_script and ngram_script (the scheduler core driven by scripted events);
scripted_executor (stand-in draft executors); streamed_calls (tool-call streams added up as
a client adds them); mixed_quants (a tiny model of mixed tensor types).
"""

from pathlib import Path

FAULTS_DIR = Path(__file__).parent / "faults"
JOBS_DIR = Path(__file__).parent / "jobs"   # scripts tests run under mpiexec


def fault_env(**variables: str) -> dict[str, str]:
    """The environment that injects faults (faults/sitecustomize.py) into the pipeinfer
    processes a test launches: its directory first on PYTHONPATH, and `variables`."""
    import os

    path = os.pathsep.join(p for p in (str(FAULTS_DIR), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **variables}
