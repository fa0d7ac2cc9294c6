"""`pipeinfer serve` in a job launched by someone else (`mpiexec -n N pipeinfer serve`, as
under srun in an allocation): rank 0 runs the same front as `serve --ranks N` on a thread
and talks to the head over an in-process pipe, without failover. It listens before the model
loads, says that it has no failover, answers exactly, and ends every rank on SIGTERM; a
worker killed outright ends the job with every request answered 503 saying why. The HTTP API
itself is tested through the front (tests/test_serve.py and the modules beside it)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

from support.serve_oracle import N_CTX, expected
from support.serving import Server

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]


def test_serves_exactly_without_failover_and_ends_on_sigterm(smollm2, tokenizer, tmp_path):
    srv = Server(tmp_path, 3, "-m", str(smollm2), "-c", str(N_CTX), "--no-cache-prompt",
                 in_job=True)
    try:
        health = srv.wait_ready(150)
        # listening before the job is ready, and saying so (SmolLM2 may load before the
        # first look at /health: the order of the log's lines says it then)
        log = srv.stderr
        assert log.index("listening on") < log.index("ready: rank 0"), log
        assert all(code == 503 for code in srv.early), srv.early
        assert [r["rank"] for r in health["ranks"]] == [0, 1, 2]
        assert "serving without failover" in srv.stderr
        prompt = "def fibonacci(n):\n"
        r = httpx.post(srv.url + "/v1/completions", timeout=120,
                       json={"prompt": prompt, "max_tokens": 24, "temperature": 0})
        text, n, reason = expected(smollm2, tokenizer, tokenizer.tokenize(prompt), 24)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == text
        assert r.json()["usage"]["completion_tokens"] == n
        metrics = httpx.get(srv.url + "/metrics").text
        assert f"pipeinfer_completion_tokens_total {float(n)}" in metrics
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(30)
        deadline = time.monotonic() + 5
        while srv.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.processes() == [] and "Traceback" not in srv.stderr, srv.stderr
    finally:
        srv.kill()


def test_a_killed_worker_ends_the_job(smollm2, tmp_path):
    """A worker SIGKILLed while two requests are under way: the launcher ends the job; the
    head first answers both with 503 saying why (the streamed one as its last event), and
    its supervisor names the rank; nothing is left running."""
    srv = Server(tmp_path, 3, "-m", str(smollm2), "-c", str(N_CTX), in_job=True)  # --parallel 4
    answers = {}
    try:
        srv.wait_ready(60)
        ready = next(line for line in srv.stderr.splitlines() if "ready: rank 0" in line)
        pid = int(ready.split("rank 2 pid ")[1].split()[0])
        body = {"prompt": "Count: one, two,", "max_tokens": 400, "temperature": 0}

        def whole() -> None:
            answers["whole"] = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)

        asking = threading.Thread(target=whole)
        asking.start()
        with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True},
                          timeout=60) as r:
            lines = []
            for line in r.iter_lines():
                lines += [line] if line else []
                if len(lines) == 4 and line:
                    os.kill(pid, signal.SIGKILL)
            last = json.loads(lines[-1].removeprefix("data: "))
        asking.join(60)
        srv.proc.wait(30)
        assert "(2 under way)" in srv.stderr   # both were generating (the default --parallel)
        deadline = time.monotonic() + 5
        while srv.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert srv.processes() == []
        assert "rank 2" in srv.stderr and "SIGKILL" in srv.stderr, srv.stderr
        assert last["error"]["code"] == 503 and "launcher" in last["error"]["message"], last
        whole = answers["whole"]
        assert whole.status_code == 503 and "another rank" in whole.json()["error"]["message"]
        with pytest.raises(httpx.TransportError):
            httpx.get(srv.url + "/health", timeout=2)
    finally:
        srv.kill()
