"""`pipeinfer serve` as users launch it, for the tests: the front (`serve --ranks N`, which
launches the job itself and fails over), or a job launched by mpiexec or another launcher
whose rank 0 serves (without failover). In a session of its own, output in files; every
process it started is found and killed at the end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx

from support import mpi_util

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Server:
    def __init__(self, tmp: Path, n: int, *args: str, in_job: bool = False,
                 launcher: list[str] | None = None):
        """`n` ranks; `in_job`: `mpiexec -n n pipeinfer serve ...`; `launcher`: a command
        that launches the ranks itself (experiments/cluster.py ... --), in-job too; else
        the front, `pipeinfer serve --ranks n ...`. The front's channel directory is made
        under `tmp` (TMPDIR), so its jobs' processes can be told by their command lines."""
        self.tmp, self.url = tmp, ""   # the url once it says where it listens (--port 0)
        self.err_path = tmp / "stderr.txt"
        self.in_job = in_job or launcher is not None
        serve = [str(mpi_util.PIPEINFER), "serve", "--port", "0", *args]
        if launcher:
            cmd = launcher + serve
        elif in_job:
            cmd = mpi_util.mpi_command(n, serve)
        else:
            cmd = [str(mpi_util.PIPEINFER), "serve", "--ranks", str(n), "--port", "0", *args]
        env = mpi_util.mpi_env({"TMPDIR": str(tmp)})
        with open(tmp / "stdout.txt", "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env,
                                         start_new_session=True, stdin=subprocess.DEVNULL)
        self.early: list[int] = []   # /health statuses before it was ready

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def health(self) -> httpx.Response:
        return httpx.get(self.url + "/health", timeout=5)

    def wait_ready(self, timeout: float = 150, after_job: int = 0) -> dict:
        """/health's answer once a job later than `after_job` takes requests."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server ended:\n{self.stderr}"
            if not self.url:
                said = re.search(r"listening on (http://[^\s;]+)", self.stderr)
                self.url = said.group(1) if said else ""
                time.sleep(0.1)
                continue
            try:
                r = self.health()
                if r.status_code == 200 and r.json()["job"] > after_job:
                    return r.json()
                self.early.append(r.status_code)
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"not ready in {timeout} s:\n{self.stderr}")

    def processes(self) -> list[str]:
        """`pid args` of the processes still alive that it started: those of the launch's
        session (mpiexec, proxies, supervisors, ranks; the front) and the front's jobs."""
        out = subprocess.run(["ps", "-ww", "-eo", "pid=,sid=,args="], capture_output=True,
                             text=True).stdout
        sid, mark = str(self.proc.pid), str(self.tmp / "pipeinfer-front-")
        return [f"{line.split()[0]} {line.split(None, 2)[2]}" for line in out.splitlines()
                if line.split()[1:2] == [sid] or mark in line]

    def job_processes(self) -> list[int]:
        """Pids of the processes of the front's jobs (launcher, supervisors, ranks)."""
        mark = str(self.tmp / "pipeinfer-front-")
        return [int(line.split()[0]) for line in self.processes() if mark in line]

    def kill(self) -> None:
        if self.proc.poll() is None:
            mpi_util._kill_group(self.proc.pid)
        for line in self.processes():
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


def serving(srv: Server, timeout: float = 150):
    """A module fixture's server: ready, then killed when the module is done."""
    try:
        srv.wait_ready(timeout)
        yield srv
    finally:
        srv.kill()


def metric(server: Server, name: str) -> float:
    """The value /metrics gives for `name` (a metric without labels)."""
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    return float(next(line.split()[1] for line in text.splitlines()
                      if line.startswith(name + " ")))


def openai_client(srv: Server, timeout: float = 120):
    from openai import OpenAI

    return OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=timeout)
