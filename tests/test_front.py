"""`pipeinfer serve --ranks N`: the front outside MPI keeps the service up when the job dies
(issue 32). Real front, real mpiexec, real SIGKILLs of ranks, real HTTP clients: every
answer resumed after a kill equals the undisturbed answer, streamed or whole, greedy or
sampled with a seed; /health says `recovering` meanwhile; SIGTERM to the front leaves no
process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from support import mpi_util
from support.failover import (KILL_AFTER, N_TOKENS, PROMPTS, Stream, complete, kill_mid_stream,
                              streams_going)
from support.serving import Server

# a job's log of what it took back after a failure (job/restore.py)
TAKEN = re.compile(r"kept cells of request (\d+): (\d+) of its (\d+) tokens on every rank")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def front(smollm2, tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("front"), 3, "-m", str(smollm2), "--parallel", "4",
                "--no-cache-prompt", "--max-restarts", "50")   # (its tests kill it often)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def undisturbed(front):
    return {p: complete(front.url, p) for p in PROMPTS}


@pytest.mark.parametrize("rank", [1, 0], ids=["worker", "head"])
def test_streams_resume_exactly_after_a_rank_is_killed(front, undisturbed, rank):
    streams, seen = kill_mid_stream(front, rank)
    for s, prompt in zip(streams, PROMPTS):
        assert s.error is None and s.done, (s.error, front.stderr[-3000:])
        assert s.text == undisturbed[prompt], (prompt, s.text, undisturbed[prompt])
    assert (503, "recovering") in seen["statuses"], seen["statuses"]
    assert "request(s) resume" in front.stderr


def test_the_launcher_killed_leaves_nothing_of_its_job(front, undisturbed):
    before = front.wait_ready()
    old = set(front.job_processes())
    launcher = next(pid for pid in old if _cmdline(pid).startswith(str(mpi_util.MPIEXEC)))
    os.kill(launcher, signal.SIGKILL)
    front.wait_ready(after_job=before["job"])
    assert not old & set(front.job_processes()), "processes of the killed job remain"
    assert complete(front.url, PROMPTS[1]) == undisturbed[PROMPTS[1]]



def test_a_rank_killed_while_the_next_job_loads(front, undisturbed):
    """Kill -9 during a relaunch: a worker dies mid-stream, then a rank of the job that
    replaces it dies while that job is still starting (before it takes requests); the job
    after that takes them, and every answer equals the undisturbed one."""
    before = front.wait_ready()
    streams = streams_going(front)
    old = set(front.job_processes())
    os.kill(next(r["pid"] for r in before["ranks"] if r["rank"] == 1), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not (new := [p for p in front.job_processes() if p not in old and _is_rank(p)]):
        assert time.monotonic() < deadline, f"no next job:\n{front.stderr[-3000:]}"
        time.sleep(0.02)
    os.kill(new[0], signal.SIGKILL)
    front.wait_ready(after_job=before["job"] + 1)
    for s in streams:
        s.join(240)
    assert f"job {before['job'] + 1} ready" not in front.stderr   # it died starting
    assert [s.error for s in streams] == [None] * 4 and all(s.done for s in streams)
    assert [s.text for s in streams] == [undisturbed[p] for p in PROMPTS]

def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_seeded_sampling_resumes_identically(front):
    fields = {"temperature": 0.9, "seed": 1234, "top_k": 40, "top_p": 0.95}
    reference = {p: complete(front.url, p, **fields) for p in PROMPTS}
    streams, _ = kill_mid_stream(front, 2, **fields)
    for s, prompt in zip(streams, PROMPTS):
        assert s.error is None and s.done, s.error
        assert s.text == reference[prompt], (prompt, s.text, reference[prompt])


def test_a_whole_answer_just_takes_longer(front):
    """A non-streamed answer long enough (600 tokens, EOS ignored) that the kill lands in it
    on an idle machine too (SmolLM2 answered 64 tokens within the second before the kill)."""
    long = {"max_tokens": 600, "ignore_eos": True}
    reference = complete(front.url, PROMPTS[0], **long)
    before = front.wait_ready()
    answers: dict = {}
    thread = threading.Thread(target=lambda: answers.update(
        text=complete(front.url, PROMPTS[0], **long)), daemon=True)
    thread.start()
    time.sleep(1.0)
    os.kill(next(r["pid"] for r in before["ranks"] if r["rank"] == 1), signal.SIGKILL)
    thread.join(240)
    assert answers.get("text") == reference
    assert front.wait_ready(after_job=before["job"])["job"] > before["job"]


def test_metrics_count_restarts_and_resumed_requests(front):
    front.wait_ready()
    text = httpx.get(front.url + "/metrics", timeout=10).text
    restarts = float(re.search(r"^pipeinfer_front_job_restarts_total (\S+)$", text, re.M)[1])
    resumed = float(re.search(r"^pipeinfer_front_requests_resumed_total (\S+)$", text,
                              re.M)[1])
    assert restarts >= 1 and resumed >= 1, text
    assert "pipeinfer_front_recovery_seconds_count" in text
    assert "pipeinfer_completion_tokens_total" in text   # the job's own, after the front's


def test_sigterm_ends_the_front_and_every_rank(smollm2, tmp_path):
    srv = Server(tmp_path, 2, "-m", str(smollm2))
    try:
        srv.wait_ready()
        assert srv.job_processes()
        stream = Stream(srv.url, PROMPTS[0], max_tokens=1500, ignore_eos=True)
        stream.start()
        deadline = time.monotonic() + 60
        while len(stream.chunks) < 5:   # under way (and far from its end)
            assert time.monotonic() < deadline and stream.is_alive(), stream.error
            time.sleep(0.02)
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(35)
        while srv.job_processes() and time.monotonic() - t0 < 30:
            time.sleep(0.2)
        assert not srv.job_processes(), "processes of the job outlived the front"
        assert time.monotonic() - t0 < 30
        stream.join(10)
        assert not stream.done   # ended with an error object, not a false [DONE]
    finally:
        srv.kill()


def test_the_front_loads_neither_mpi_nor_llama_cpp() -> None:
    code = ("import sys, pipeinfer.front.main, pipeinfer.front.in_job; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('mpi4py', 'llama_cpp')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_ranks_under_mpiexec_is_refused(smollm2) -> None:
    res = mpi_util.launch(mpi_util.mpi_command(2, [str(mpi_util.PIPEINFER), "serve",
                                                   "--ranks", "2", "-m", str(smollm2)]),
                          timeout=60)
    assert res.rc == 2 and "without mpiexec" in res.stderr, res.describe()


def test_a_bad_hostfile_is_one_line(tmp_path, smollm2) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("nodeA:x\n")
    res = subprocess.run([str(mpi_util.PIPEINFER), "serve", "--ranks", "2", "--hostfile",
                          str(hostfile), "-m", str(smollm2)], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "not a host" in res.stderr and "Traceback" not in \
        res.stderr, res.stderr


# --- a host lost, on the emulated cluster (experiments/cluster.py --as-mpiexec) -----------

def _cluster_hosts(state: Path, private: bool = False) -> list[str]:
    """serve's options for the 4 emulated nodes, their hosts marked down under `state`; the
    nodes reach the front (on this machine, outside them) over TCP. `private`: every node
    but node0 has a disk of its own (a lost node's is gone with it; only node0 has the
    model, so a job without node0 could not start); else all share one, as nodes sharing a
    file system do."""
    from support.cluster import CLUSTER, FRONT_ADDRESS
    disks = f"--disks private --disk-root {state / 'disks'} " if private else ""
    return ["--hosts", "node0,node1,node2,node3", "--front-address", FRONT_ADDRESS,
            "--mpiexec", f"{sys.executable} {CLUSTER} --cpu 0.5 --link gigabit --state {state} "
                         f"{disks}--as-mpiexec"]


@pytest.mark.parametrize("lost", ["node2", "node0"])   # a worker's host; the head's
def test_a_host_lost_is_left_out_and_answers_stay_exact(smollm2, tmp_path, undisturbed, lost):
    """The front outside the nodes, the head reaching it over TCP: a node whose link goes
    down is left out, the next job (its head on node1 when node0 went) resumes every
    request exactly."""
    srv, state = _cluster_front(smollm2, tmp_path, "--parallel", "4", "--no-cache-prompt",
                                private=lost != "node0")
    try:
        before = srv.wait_ready(240)
        assert len(before["ranks"]) == 4
        streams = [Stream(srv.url, p) for p in PROMPTS]
        for s in streams:
            s.start()
        deadline = time.monotonic() + 120
        while any(len(s.chunks) < KILL_AFTER and s.is_alive() for s in streams):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        (state / "down" / lost).touch()   # its links go down, its rank dies
        after = srv.wait_ready(240, after_job=before["job"])
        assert len(after["ranks"]) == 3   # (the head on node1 when node0 went)
        for s, prompt in zip(streams, PROMPTS):
            s.join(240)
            assert s.error is None and s.done, s.error
            assert s.text == undisturbed[prompt], (prompt, s.text, undisturbed[prompt])
        assert f"host {lost} does not answer: left out" in srv.stderr
        assert "the job's head reaches the front at 10.78.255.1:" in srv.stderr
        if lost == "node2":   # a worker's: its neighbours took over its layers and their
            assert "every surviving rank keeps its layers" in srv.stderr   # cells
            taken = [int(n) for _, n, _ in TAKEN.findall(srv.stderr)]
            assert len(taken) == len(PROMPTS) and all(taken), srv.stderr[-4000:]
    finally:
        srv.kill()


def _cluster_front(smollm2, tmp_path: Path, *args: str, env: dict | None = None,
                   private: bool = False):
    from support.cluster import NO_NETNS
    if NO_NETNS is not None:
        pytest.skip(NO_NETNS)
    state = tmp_path / "hosts"
    (state / "down").mkdir(parents=True)
    srv = Server(tmp_path, 4, "-m", str(smollm2), *_cluster_hosts(state, private), *args)
    return srv, state


def test_a_host_that_answers_again_joins_back(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEINFER_REJOIN_S", "1")
    srv, state = _cluster_front(smollm2, tmp_path)
    try:
        first = srv.wait_ready(240)
        (state / "down" / "node3").touch()
        second = srv.wait_ready(240, after_job=first["job"])
        assert len(second["ranks"]) == 3
        (state / "down" / "node3").unlink()
        third = srv.wait_ready(240, after_job=second["job"])
        assert len(third["ranks"]) == 4
        assert "node3 answer again" in srv.stderr
        assert complete(srv.url, PROMPTS[1])
    finally:
        srv.kill()



def test_no_host_left_is_a_503_saying_so_until_hosts_answer_again(smollm2, tmp_path,
                                                                  monkeypatch, undisturbed):
    """Every host gone: /health and every request that comes get a 503 that says why (with
    Retry-After) instead of waiting; the front keeps probing, and hosts that answer again bring
    the service back on the ranks they hold, its answers exact."""
    monkeypatch.setenv("PIPEINFER_REJOIN_S", "1")
    srv, state = _cluster_front(smollm2, tmp_path, "--no-cache-prompt")
    try:
        first = srv.wait_ready(240)
        for k in range(4):
            (state / "down" / f"node{k}").touch()
        deadline = time.monotonic() + 180
        while not ((r := srv.health()).status_code == 503 and "no host" in r.text):
            assert time.monotonic() < deadline, srv.stderr[-3000:]
            time.sleep(0.2)
        assert r.json()["status"] == "waiting" and r.headers.get("retry-after")
        body = {"prompt": PROMPTS[1], "max_tokens": N_TOKENS, "temperature": 0}
        refused = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
        assert refused.status_code == 503 and "no host" in refused.text, refused.text
        for k in (0, 1):
            (state / "down" / f"node{k}").unlink()
        back = srv.wait_ready(240, after_job=first["job"])
        assert len(back["ranks"]) == 2
        assert complete(srv.url, PROMPTS[1]) == undisturbed[PROMPTS[1]]
    finally:
        srv.kill()

def test_a_host_whose_rank_keeps_dying_is_left_out(smollm2, tmp_path, monkeypatch):
    """Its host answers all along: it stays out (quarantined) although the front looks for
    hosts to take back every second here."""
    monkeypatch.setenv("PIPEINFER_REJOIN_S", "1")
    srv, state = _cluster_front(smollm2, tmp_path)
    try:
        health = srv.wait_ready(240)
        for _ in range(3):
            os.kill(next(r["pid"] for r in health["ranks"] if r["rank"] == 3), signal.SIGKILL)
            health = srv.wait_ready(240, after_job=health["job"])
        assert len(health["ranks"]) == 3
        assert "host node3 answers, but its rank failed 3 times in a row (not taken back " \
               "for 600 s): left out" in srv.stderr
        time.sleep(5)
        later = srv.health().json()
        assert later["job"] == health["job"] and len(later["ranks"]) == 3
        assert "answer again" not in srv.stderr
    finally:
        srv.kill()


def test_requests_wait_through_a_recovery_and_beyond_the_queue_get_503(smollm2, tmp_path):
    srv = Server(tmp_path, 2, "-m", str(smollm2), "--parallel", "1", "--queue", "1")
    try:
        health = srv.wait_ready()
        os.kill(next(r["pid"] for r in health["ranks"] if r["rank"] == 0), signal.SIGKILL)
        while srv.health().status_code == 200:
            time.sleep(0.02)
        answers: list = []
        waiting = [threading.Thread(target=lambda p=p: answers.append(complete(srv.url, p)),
                                    daemon=True) for p in PROMPTS[:2]]
        for t in waiting:
            t.start()
        time.sleep(0.3)
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 4},
                       timeout=30)
        assert r.status_code == 503 and r.headers.get("retry-after"), r.text
        for t in waiting:
            t.join(120)
        assert len(answers) == 2 and all(answers)
    finally:
        srv.kill()


def test_clients_gone_during_a_recovery_are_not_generated(front):
    before = front.wait_ready()
    streams = [Stream(front.url, p, max_tokens=400) for p in PROMPTS]
    clients = []
    for s in streams:
        c = httpx.Client(timeout=300)
        clients.append(c)
        s.run = lambda s=s, c=c: _read_some(c, s)
        s.start()
    time.sleep(2.0)
    os.kill(next(r["pid"] for r in before["ranks"] if r["rank"] == 1), signal.SIGKILL)
    while front.health().status_code == 200:
        time.sleep(0.02)
    for c in clients:   # every client goes away while the job is replaced
        c.close()
    front.wait_ready(after_job=before["job"])
    deadline = time.monotonic() + 5   # (4 x 400 tokens would take far longer)
    while time.monotonic() < deadline:
        text = httpx.get(front.url + "/metrics", timeout=10).text
        if re.search(r"^pipeinfer_requests_running 0\.0$", text, re.M):
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the new job still generates for clients that left")
    assert complete(front.url, PROMPTS[0])


def _read_some(client: httpx.Client, stream: Stream) -> None:
    try:
        with client.stream("POST", stream.url + "/v1/completions", json=stream.body) as r:
            for line in r.iter_lines():
                stream.chunks.append(line)
    except Exception:  # noqa: BLE001 (closed by the test)
        pass


# --- the soak: clients in a loop while ranks are killed at random -------------------------
# (a short one: the 10-minute soak with its speed and memory figures is a benchmark,
# experiments/bench_failover.py soak)

SOAK_S = float(os.environ.get("PIPEINFER_SOAK_S", 90))


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmRSS:")))


def test_soak_every_request_completes_exactly_while_ranks_die(smollm2, tmp_path):
    import random
    rng = random.Random(32)
    srv = Server(tmp_path, 3, "-m", str(smollm2), "--parallel", "4", "--no-cache-prompt",
                "--max-restarts", "1000")
    try:
        srv.wait_ready()
        reference = {p: complete(srv.url, p, max_tokens=48) for p in PROMPTS}
        end, results, kills = time.monotonic() + SOAK_S, [], []

        def client(i: int) -> None:
            while time.monotonic() < end:
                prompt = PROMPTS[(i + len(results)) % len(PROMPTS)]
                s = Stream(srv.url, prompt, max_tokens=48)
                s.run()
                results.append((s.done and s.error is None, s.text == reference[prompt],
                                s.error))

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        rss_after_a_minute = None
        started = time.monotonic()
        while time.monotonic() < end:
            time.sleep(rng.uniform(30, 60) if SOAK_S >= 300 else rng.uniform(8, 15))
            if rss_after_a_minute is None and time.monotonic() - started >= 60:
                rss_after_a_minute = _rss_kb(srv.proc.pid)
            ranks = [pid for pid in srv.job_processes() if _is_rank(pid)]
            if ranks and time.monotonic() < end:
                victim = rng.choice(ranks)
                kills.append(victim)
                os.kill(victim, signal.SIGKILL)
        for t in threads:
            t.join(300)
        failed = [r for r in results if not (r[0] and r[1])]
        assert results and not failed, (len(results), failed[:5], srv.stderr[-4000:])
        assert len(kills) >= 2
        if rss_after_a_minute is not None:
            grown = _rss_kb(srv.proc.pid) - rss_after_a_minute
            assert grown < 10_000, f"the front's RSS grew by {grown} kB"
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(35)
        assert not srv.job_processes(), "processes of the job outlived the front"
    finally:
        srv.kill()


def _is_rank(pid: int) -> bool:
    """A pipeinfer rank (or its supervisor), not the launcher or its proxy."""
    args = _cmdline(pid).split()
    return "serve" in args and not any(a.endswith("mpiexec") for a in args)


def test_speculating_lanes_resume_exactly(smollm2, tmp_path, undisturbed):
    """pipeinfer with a draft model (lanes verify drafts in their own runs while others are
    under way): resumed after a worker is killed, every answer equals the undisturbed one."""
    srv = Server(tmp_path, 3, "-m", str(smollm2), "-md", str(smollm2), "--strategy",
                "pipeinfer", "--parallel", "4", "--no-cache-prompt")
    try:
        srv.wait_ready()
        streams, _ = kill_mid_stream(srv, 1)
        for s, prompt in zip(streams, PROMPTS):
            assert s.error is None and s.done, s.error
            assert s.text == undisturbed[prompt], (prompt, s.text, undisturbed[prompt])
    finally:
        srv.kill()


def test_a_job_that_cannot_start_ends_the_front_with_its_reason(tmp_path) -> None:
    res = subprocess.run([str(mpi_util.PIPEINFER), "serve", "--ranks", "2", "--port", "0",
                          "-m", str(tmp_path / "missing.gguf")], capture_output=True,
                         text=True, timeout=120, env=mpi_util.mpi_env({"TMPDIR": str(tmp_path)}))
    assert res.returncode == 1, res.stderr
    assert "giving up: the job failed to start: model file not found" in res.stderr
    assert "Traceback" not in res.stderr


def test_embeddings_and_tool_calls_come_through_the_front(front, smollm2):
    """What the job answers with its template and its last stage's states (a tool call in
    the generic format, an embedding) comes back through the front as from the job's own
    server (tests/test_serve_tools_generic.py, tests/test_serve_embeddings.py)."""
    import numpy as np

    from support.llama_oracle import token_states
    from pipeinfer.engine.head.embedding_job import MEAN, pool

    front.wait_ready()
    r = httpx.post(front.url + "/v1/embeddings", timeout=120,
                   json={"input": "Hello there", "encoding_format": "float"})
    assert r.status_code == 200, r.text
    states, _ = token_states(smollm2, "Hello there")
    assert np.array_equal(np.array(r.json()["data"][0]["embedding"], np.float32),
                          pool(states, MEAN))
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    r = httpx.post(front.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [weather], "tool_choice": "required", "max_tokens": 40, "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_a_job_that_served_a_while_is_started_again_at_once(smollm2, tmp_path):
    """The back-off is for jobs that fail as they start: a job that was up for USEFUL_S
    before a rank died is launched again at once, also the second time in a row (the soak's
    kills 30-60 s apart would otherwise wait 1, 2, 5, 10, then 30 s each)."""
    trace = tmp_path / "front.jsonl"
    srv = Server(tmp_path, 3, "-m", str(smollm2), "--parallel", "2", "--no-cache-prompt",
                 "--trace", str(trace))
    try:
        health = srv.wait_ready()
        for _ in range(2):
            time.sleep(11)   # (USEFUL_S: 10)
            os.kill(next(r["pid"] for r in health["ranks"] if r["rank"] == 1), signal.SIGKILL)
            health = srv.wait_ready(after_job=health["job"])
        events = [json.loads(line) for line in trace.read_text().splitlines()]
        ends = [e["t"] for e in events if e["name"] == "job_end"]
        starts = [e["t"] for e in events if e["name"] == "job_start"][1:]
        gaps = [start - end for end, start in zip(ends, starts)]
        assert len(gaps) == 2 and max(gaps) < 0.8, gaps
    finally:
        srv.kill()
