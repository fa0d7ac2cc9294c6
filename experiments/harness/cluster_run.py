"""Running one experiments/cluster.py job from a benchmark so that it never outlives it."""
from __future__ import annotations

import subprocess
from pathlib import Path

from . import ROOT

# cluster.py's own cleanup after SIGTERM: the job's ranks (10 s), its cgroups and links.
STOP_GRACE_S = 30


def run_cluster(command: list[str], timeout: float, env: dict | None = None,
                cwd: Path | str = ROOT) -> tuple[int | None, str, str]:
    """Run a cluster.py command: (its exit code, None if it hung; stdout; stderr). A hung one,
    or one running when this process is stopped (the exception passes on), gets SIGTERM, so
    that cluster.py takes its job, cgroups and links down with it (SIGKILL, which
    subprocess.run sends, would leave them all behind), and SIGKILL only STOP_GRACE_S later."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return (None, *stop(proc))
    except BaseException:
        stop(proc)
        raise
    return proc.returncode, out, err


def stop(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGTERM to a cluster.py process, SIGKILL if it is still there STOP_GRACE_S later; its
    remaining output."""
    proc.terminate()
    try:
        return proc.communicate(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def failure(code: int | None, timeout: float) -> str:
    """How a run_cluster job that did not exit 0 ended, for a benchmark's error line."""
    return f"hung (stopped after {timeout:.0f} s)" if code is None else f"failed ({code})"
