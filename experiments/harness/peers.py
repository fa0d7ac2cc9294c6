"""llama.cpp's RPC backend on the emulated cluster: one `ggml-rpc-server` per worker node, each in
the CPU quota (and, with links, the network namespace) a pipeinfer rank of that node would get,
and the main-host program (llama-completion, llama-speculative) on node 0 with --rpc to them.

    with PeerCluster(bin_dir, quotas, links) as cluster:      # one per run
        out = cluster.run(["llama-completion", ...], timeout=600)

Every process's peak resident memory (VmHWM) is read while it runs, per node; a peer that
crashes or hangs is reported by PeerRun.error with its log's last line, never raised.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .cpu_quota import CpuQuotas, join_quota

BASE_PORT = 50152


@dataclass
class PeerRun:
    stdout: str
    stderr: str
    returncode: int | None          # None: killed after the timeout
    peak_rss_mb: list[float] = field(default_factory=list)   # per node, node 0 first
    error: str | None = None


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


class PeerCluster:
    """rpc-servers on nodes 1..N-1 for the lifetime of the context; run() the main program."""

    def __init__(self, bin_dir: Path, quotas: CpuQuotas, links=None, threads: int = 1,
                 rpc_cache: list[Path] | None = None):
        """`rpc_cache`: a tensor cache directory per worker node (rpc-server -c, through
        LLAMA_CACHE), None for none."""
        self.bin_dir, self.quotas, self.links, self.threads = bin_dir, quotas, links, threads
        self.rpc_cache = rpc_cache
        self.nodes = len(quotas.cpus)
        self.servers: list[subprocess.Popen] = []
        self.logs: list[Path] = []

    def host(self, node: int) -> str:
        return self.links.address(node) if self.links else "127.0.0.1"

    def port(self, node: int) -> int:
        return BASE_PORT + node

    def endpoints(self) -> str:
        return ",".join(f"{self.host(n)}:{self.port(n)}" for n in range(1, self.nodes))

    def _popen(self, node: int, command: list[str], **kwargs) -> subprocess.Popen:
        if self.links:
            command = ["nsenter", f"--net=/run/netns/{self.links.ns(node)}", "--"] + command
        root = self.quotas.root
        return subprocess.Popen(command, preexec_fn=lambda: join_quota(root, node),
                                start_new_session=True, **kwargs)

    def __enter__(self) -> "PeerCluster":
        try:
            for node in range(1, self.nodes):
                log = Path(f"/tmp/pipeinfer-peer-{os.getpid()}-rpc{node}.log")
                self.logs.append(log)
                command = [str(self.bin_dir / "ggml-rpc-server"), "-H", self.host(node),
                           "-p", str(self.port(node)), "-t", str(self.threads)]
                env = None
                if self.rpc_cache:
                    command.append("-c")
                    env = {**os.environ, "LLAMA_CACHE": str(self.rpc_cache[node - 1])}
                with open(log, "w") as out:
                    self.servers.append(self._popen(node, command, stdout=out, env=env,
                                                    stderr=subprocess.STDOUT))
            for node, server in enumerate(self.servers, start=1):
                self._wait_listening(node, server)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_listening(self, node: int, server: subprocess.Popen, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise RuntimeError(f"ggml-rpc-server on node {node} exited "
                                   f"({server.returncode}): "
                                   f"{last_line(self.logs[node - 1].read_text(errors='replace'))}")
            if self._listening(node):
                return
            time.sleep(0.1)
        raise RuntimeError(f"ggml-rpc-server on node {node} did not listen within {timeout} s")

    def _listening(self, node: int) -> bool:
        if self.links:  # the port is inside the node's namespace: ask from there
            probe = subprocess.run(["nsenter", f"--net=/run/netns/{self.links.ns(0)}", "--",
                                    "bash", "-c", f"exec 3<>/dev/tcp/{self.host(node)}/"
                                    f"{self.port(node)}"], capture_output=True)
            return probe.returncode == 0
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex((self.host(node), self.port(node))) == 0

    def __exit__(self, *exc) -> None:
        for server in self.servers:
            if server.poll() is None:
                server.terminate()
        for server in self.servers:
            try:
                server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        for log in self.logs:
            log.unlink(missing_ok=True)

    def start_main(self, command: list[str], **kwargs) -> subprocess.Popen:
        """Start the main-host program on node 0 (a server: llama-server), in its quota."""
        return self._popen(0, command, **kwargs)

    def run(self, command: list[str], timeout: float) -> PeerRun:
        """Run the main-host program on node 0, with the peak RSS of it and of every rpc-server
        (a server's peak covers its whole life: use one PeerCluster per run)."""
        proc = self.start_main(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        peak: float | None = None
        deadline = time.monotonic() + timeout
        out = err = ""
        while True:
            peak = peak_rss_mb(proc.pid) or peak
            try:
                out, err = proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    proc.kill()
                    out, err = proc.communicate()
                    return PeerRun(out, err, None, error=f"hung: killed after {timeout:.0f} s "
                                   f"(last line: {last_line(err)})")
            except BaseException:   # the bench stopped (Ctrl-C, SIGTERM): not left running
                proc.kill()
                proc.wait()
                raise
        rss = [round(peak or 0.0, 1)] + [round(peak_rss_mb(s.pid) or 0.0, 1)
                                        for s in self.servers]
        run = PeerRun(out, err, proc.returncode, rss)
        dead = [n for n, s in enumerate(self.servers, start=1) if s.poll() is not None]
        if proc.returncode != 0:
            said = last_line(err) if err.strip() else (
                "(it printed nothing: llama.cpp's logging thread may drop its last lines when "
                "a program exits early; run the command alone to read them)")
            run.error = f"exit {proc.returncode}: {said}"
        elif dead:
            run.error = f"rpc-server on node {dead[0]} died"
        return run
