"""`pipeinfer serve --ranks N --stall-timeout S --trace FILE` (issue 32): a job that hangs
instead of dying (a rank SIGSTOPped) is killed after S quiet seconds with requests under way
and its requests resume on a new job, exactly; an idle job is never taken for hung, nor is a
slow one whose head keeps beating (a long prompt); the front's trace records each job's
start, readiness and end (with why), each request resumed and the recovery time. Real front,
real mpiexec, SmolLM2 (tests/test_front.py's patterns)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from pipeinfer.front.watchdog import Watchdog, stopped_ranks
from support.failover import KILL_AFTER, PROMPTS, Stream, complete, kill_mid_stream
from support.serving import Server

STALL_S = 5.0
RELAUNCH_S = 40.0   # a relaunch of SmolLM2 on 3 ranks from the stage caches, loaded machine


@pytest.fixture(scope="module")
def watched(smollm2, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watched")
    srv = Server(tmp, 3, "-m", str(smollm2), "--parallel", "4", "--no-cache-prompt",
                "--max-restarts", "50", "--stall-timeout", str(STALL_S),
                "--trace", str(tmp / "trace.jsonl"))
    srv.trace = tmp / "trace.jsonl"
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def reference(watched):
    return {p: complete(watched.url, p) for p in PROMPTS}


def _records(front: Server, after: float = 0.0) -> list[dict]:
    lines = front.trace.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["t"] >= after]


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.1)
    return False


def _wait_streams(streams: list[Stream], chunks: int) -> None:
    deadline = time.monotonic() + 120
    while any(len(s.chunks) < chunks and s.is_alive() for s in streams):
        assert time.monotonic() < deadline, "the streams did not get going"
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 0], ids=["worker", "head"])
def test_a_stopped_rank_is_killed_and_the_streams_resume_exactly(watched, reference, rank):
    before = watched.wait_ready()
    old = set(watched.job_processes())
    streams = [Stream(watched.url, p) for p in PROMPTS]
    for s in streams:
        s.start()
    _wait_streams(streams, KILL_AFTER)
    pid = next(r["pid"] for r in before["ranks"] if r["rank"] == rank)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        after = watched.wait_ready(STALL_S + RELAUNCH_S, after_job=before["job"])
        took = time.monotonic() - stopped_at
        for s in streams:
            s.join(120)
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGCONT)   # (the test failed: let it be killed normally)
    for s, prompt in zip(streams, PROMPTS):
        assert s.error is None and s.done, (s.error, watched.stderr[-3000:])
        assert s.text == reference[prompt], (prompt, s.text, reference[prompt])
    assert STALL_S <= took < STALL_S + RELAUNCH_S, took
    assert f"job {before['job']} hangs: no progress for" in watched.stderr
    assert f"rank {rank} (pid {pid}) is stopped" in watched.stderr
    assert _gone(pid), "the stopped rank outlived its job"
    assert not old & set(watched.job_processes()), "processes of the hung job remain"
    assert after["job"] == before["job"] + 1


@pytest.mark.slow
def test_the_trace_records_a_kill_the_new_job_and_the_resumed_requests(watched, reference):
    t0 = time.monotonic()
    streams, seen = kill_mid_stream(watched, 2)
    for s, prompt in zip(streams, PROMPTS):
        assert s.error is None and s.done, s.error
        assert s.text == reference[prompt]
    old = seen["before"]["job"]
    records = _records(watched, t0)
    names = [(r["name"], r.get("job")) for r in records]
    assert names.index(("job_end", old)) < names.index(("job_start", old + 1)) < \
        names.index(("job_ready", old + 1)), names
    end = next(r for r in records if r["name"] == "job_end" and r["job"] == old)
    assert end["reason"] and end["ready"] and not end["planned"], end
    ready = next(r for r in records if r["name"] == "job_ready" and r["job"] == old + 1)
    assert sorted(r["rank"] for r in ready["ranks"]) == [0, 1, 2]
    resumed = [r for r in records if r["name"] == "resume"]
    assert len(resumed) == len(PROMPTS), resumed
    assert all(r["job"] == old + 1 and r["sent"] > 0 and r["kind"] == "completions"
               for r in resumed), resumed
    assert len({r["request"] for r in resumed}) == len(PROMPTS)
    recovered = next(r for r in records if r["name"] == "recovered")
    assert recovered["job"] == old + 1 and recovered["requests"] == len(PROMPTS)
    assert 0 < recovered["seconds"] < 60


@pytest.mark.slow
def test_the_trace_says_why_a_hung_job_ended(watched):
    stalls = [r for r in _records(watched) if r["name"] == "stall"]
    assert stalls and stalls[0]["stopped"] and stalls[0]["quiet_s"] >= STALL_S, stalls
    end = next(r for r in _records(watched) if r["name"] == "job_end" and
               r["job"] == stalls[0]["job"])
    assert end["reason"].startswith("no progress for") and end["failed_rank"] == 1, end


@pytest.mark.slow
def test_an_idle_job_is_never_taken_for_hung_even_with_a_rank_stopped(watched, reference):
    """Idle for over twice the stall timeout, a worker stopped meanwhile: no restart (nothing
    was asked of it); the next request finds the job hung, and gets its answer from a new
    one, exactly."""
    before = watched.wait_ready()
    time.sleep(STALL_S + 1)
    pid = next(r["pid"] for r in before["ranks"] if r["rank"] == 2)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(2 * STALL_S)
        assert watched.health().json()["job"] == before["job"]
        assert complete(watched.url, PROMPTS[2]) == reference[PROMPTS[2]]
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGCONT)
    assert watched.wait_ready()["job"] > before["job"]
    assert _gone(pid)


@pytest.mark.slow
def test_a_stopped_head_is_found_by_a_metrics_scrape(watched):
    """Idle, the head stopped: /metrics (a call the head answers) waits the stall timeout,
    then gets the front's own metrics; the job is replaced."""
    before = watched.wait_ready()
    pid = next(r["pid"] for r in before["ranks"] if r["rank"] == 0)
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = httpx.get(watched.url + "/metrics", timeout=STALL_S + 30)
        assert r.status_code == 200 and "pipeinfer_front_job_restarts_total" in r.text
        stalls = re.search(r"^pipeinfer_front_job_stalls_total (\S+)$", r.text, re.M)
        assert stalls and float(stalls[1]) >= 3, r.text   # (this module's hung jobs)
        assert time.monotonic() - t0 >= STALL_S - 1
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGCONT)
    # (the default wait: after this module's failures in a row, the back-off reaches 30 s)
    assert watched.wait_ready(after_job=before["job"])["job"] > before["job"]
    assert _gone(pid)
    assert "0 request(s) and 1 call(s) under way" in watched.stderr


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["iterative", "pipeinfer"])
def test_a_slow_prompt_keeps_beating(smollm2, tmp_path, strategy):
    """A long prompt evaluated in small chunks takes several stall timeouts before its first
    token: the head's beats (a run evaluated or back) keep the watchdog quiet, also while a
    draft model takes the prompt in (pipeinfer)."""
    stall = 1.5
    draft = ["-md", str(smollm2)] if strategy == "pipeinfer" else []
    srv = Server(tmp_path, 3, "-m", str(smollm2), *draft, "--strategy", strategy, "-c", "4096",
                "-b", "32", "--parallel", "1", "--stall-timeout", str(stall))
    try:
        first = srv.wait_ready()
        prompt = " ".join(f"item {i} of the list is number {i * 7 % 100};"
                          for i in range(130))
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/v1/completions", timeout=300,
                       json={"prompt": prompt, "max_tokens": 4, "temperature": 0})
        took = time.monotonic() - t0
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] > 1500
        assert took > 2 * stall, f"the prompt took {took:.1f} s: too fast to test anything"
        assert srv.health().json()["job"] == first["job"], srv.stderr[-3000:]
        assert "no progress" not in srv.stderr
    finally:
        srv.kill()


def test_the_watchdog_counts_only_busy_quiet_time() -> None:
    dog = Watchdog(5.0)
    dog.heard = 0.0
    assert dog.quiet(False, now=100.0) is None       # idle for 100 s: nothing
    assert dog.quiet(True, now=101.0) is None        # busy from now
    assert dog.quiet(True, now=105.5) is None
    assert dog.quiet(True, now=106.0) == pytest.approx(5.0)
    dog.heard = 106.5
    assert dog.quiet(True, now=110.0) is None
    assert dog.quiet(False, now=200.0) is None and dog.busy_since is None
    assert Watchdog(0).quiet(True, now=1e9) is None  # off


def test_stopped_ranks_are_read_from_proc() -> None:
    here = "this-host"
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert stopped_ranks([(1, here, child.pid)], here) == []
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not stopped_ranks([(1, here, child.pid)], here) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stopped_ranks([(1, here, child.pid), (2, "elsewhere", child.pid)], here) == \
            [(1, child.pid)]
    finally:
        child.kill()
        child.wait()


def test_trace_without_ranks_is_refused(smollm2, tmp_path) -> None:
    """--trace is the front's: a server that is its own job (no --ranks) has none."""
    from support import mpi_util
    res = subprocess.run([str(mpi_util.PIPEINFER), "serve", "--trace", str(tmp_path / "t"),
                          "-m", str(smollm2)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--trace go with --ranks" in res.stderr, res.stderr
