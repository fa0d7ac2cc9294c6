"""Code the tests share (not tests themselves): launching pipeinfer under MPI, serving it,
and llama.cpp's own answers to compare with."""

from pathlib import Path

FAULTS_DIR = Path(__file__).parent / "faults"
JOBS_DIR = Path(__file__).parent / "jobs"   # scripts tests run under mpiexec


def fault_env(**variables: str) -> dict[str, str]:
    """The environment that injects faults (faults/sitecustomize.py) into the pipeinfer
    processes a test launches: its directory first on PYTHONPATH, and `variables`."""
    import os

    path = os.pathsep.join(p for p in (str(FAULTS_DIR), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, **variables}
