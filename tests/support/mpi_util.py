"""Launching the real `pipeinfer run` under the venv's mpiexec, for tests and experiments.

Every launch has a timeout: on expiry the whole process group of the launch (mpiexec, its
hydra proxies and the ranks) is killed, so a hung job fails its test instead of the suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

BIN = Path(sys.executable).parent
MPIEXEC = BIN / "mpiexec"
PIPEINFER = BIN / "pipeinfer"
PYTHON = Path(sys.executable)

DEFAULT_TIMEOUT = 90.0


@dataclass
class Launch:
    rc: int
    json: dict | None
    stderr: str
    stdout: str
    cmd: list[str]
    timed_out: bool = False

    def __iter__(self):  # rc, json, stderr = launch(...)
        return iter((self.rc, self.json, self.stderr))

    def describe(self) -> str:
        return (f"command: {' '.join(self.cmd)}\nrc={self.rc} timed_out={self.timed_out}\n"
                f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}")


def run_args(model: str | os.PathLike, prompt: str | None = None, *extra: str,
             n_predict: int | None = 16, as_json: bool = True) -> list[str]:
    """The `pipeinfer run ...` arguments of one rank (without the launcher)."""
    args = [str(PIPEINFER), "run", "-m", str(model)]
    if prompt is not None:
        args += ["-p", prompt]
    if n_predict is not None:
        args += ["-n", str(n_predict)]
    if as_json:
        args.append("--json")
    return args + [str(e) for e in extra]


def mpi_command(n: int, args: Sequence[str]) -> list[str]:
    return [str(MPIEXEC), "-n", str(n), *args]


def mpmd_command(groups: Sequence[tuple[int, Sequence[str]]]) -> list[str]:
    """`mpiexec -n a ARGS_A : -n b ARGS_B ...`: ranks in group order (rank 0 in the first)."""
    cmd = [str(MPIEXEC)]
    for i, (n, args) in enumerate(groups):
        if i:
            cmd.append(":")
        cmd += ["-n", str(n), *args]
    return cmd


def mpi_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop("PYTEST_CURRENT_TEST", None)
    if extra:
        env.update(extra)
    return env


def launch(cmd: Sequence[str], timeout: float = DEFAULT_TIMEOUT, env: dict | None = None,
           cwd: str | os.PathLike | None = None) -> Launch:
    """Run a command in its own session; kill its process group on timeout. The stdout's last
    line that parses as a JSON object becomes `json`."""
    cmd = [str(c) for c in cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=mpi_env(env), cwd=cwd, start_new_session=True,
                            stdin=subprocess.DEVNULL)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        out, err = proc.communicate()
    return Launch(proc.returncode, parse_json(out), err, out, cmd, timed_out)


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGTERM:
            import time
            time.sleep(1.0)


def parse_json(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def run_pipeinfer(n: int | None, model: str | os.PathLike, prompt: str | None = None,
                  *extra: str, n_predict: int | None = 16, as_json: bool = True,
                  timeout: float = DEFAULT_TIMEOUT, env: dict | None = None) -> Launch:
    """`mpiexec -n N pipeinfer run -m MODEL -p PROMPT -n N_PREDICT --json EXTRA...`; with
    n=None, plain `pipeinfer run` without a launcher."""
    args = run_args(model, prompt, *extra, n_predict=n_predict, as_json=as_json)
    cmd = args if n is None else mpi_command(n, args)
    return launch(cmd, timeout=timeout, env=env)


def error_lines(stderr: str) -> list[str]:
    """The `pipeinfer: error: ...` lines of a launch's stderr."""
    return [line for line in stderr.splitlines() if line.startswith("pipeinfer: error:")]
