"""Robustness of `pipeinfer run` under the real mpiexec: bad input, failed and interrupted
ranks, limits reached during generation, concurrent runs and a long soak run.

Every failure must end the whole job quickly with one clear message, a non-zero exit status,
no Python traceback (unless -v) and no process left behind. Each launch carries a unique
`--label` so leftover processes can be found by their command line. Cases already covered by
test_cli_errors.py (split count != ranks, model missing everywhere or on one rank, truncated
or corrupt model on one rank, -n 0, empty prompt, prompt longer than -c) are not repeated.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import pytest

from support.mpi_util import Launch, launch, mpi_command, mpmd_command, run_args
from support import fault_env

PROMPT = "def robust():"
FAIL_LIMIT_S = 10.0   # a failing job must be over within this
HOST = socket.gethostname()


# --- launching and checking ------------------------------------------------------------------

def _marker() -> str:
    return f"robust-{uuid.uuid4().hex[:12]}"


def _leftovers(marker: str, wait: float = 3.0) -> list[str]:
    """Processes whose command line holds `marker`, once they had `wait` seconds to go."""
    deadline = time.monotonic() + wait
    while True:
        out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout
        lines = [line for line in out.splitlines() if line.strip()]
        if not lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def job(n: int | None, model, prompt: str | None = PROMPT, *extra, n_predict: int | None = 16,
        env: dict | None = None, timeout: float = 60.0) -> tuple[Launch, float]:
    """`mpiexec -n N pipeinfer run ... --json --label MARKER`; also checks no process is left."""
    marker = _marker()
    args = run_args(model, prompt, *extra, "--label", marker, n_predict=n_predict)
    t0 = time.monotonic()
    res = launch(args if n is None else mpi_command(n, args), timeout=timeout, env=env)
    elapsed = time.monotonic() - t0
    assert not _leftovers(marker), f"processes left behind:\n{_leftovers(marker, 0)}"
    return res, elapsed


def assert_fails(res: Launch, elapsed: float, *fragments: str, case: str = "") -> str:
    """Failed within FAIL_LIMIT_S with exactly one error line (holding `fragments`) and no
    traceback; returns the line."""
    assert not res.timed_out, "the job hung:\n" + res.describe()
    assert res.rc != 0, res.describe()
    assert elapsed < FAIL_LIMIT_S, f"took {elapsed:.1f} s\n" + res.describe()
    assert "Traceback" not in res.stderr + res.stdout, res.describe()
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, res.describe()
    line = errors[0]
    assert line.startswith(("pipeinfer: error: ", "Error: ")), res.describe()
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    assert res.json is None
    print(f"\n[{case or 'case'}] rc={res.rc} {elapsed:.1f}s: {line}")
    return line


def assert_ok(res: Launch) -> dict:
    assert res.rc == 0 and not res.timed_out and res.json is not None, res.describe()
    assert "Traceback" not in res.stderr, res.describe()
    return res.json


@pytest.fixture
def cache_env(tmp_path: Path) -> dict:
    return {"PIPEINFER_CACHE": str(tmp_path / "cache")}


# --- bad model files ------------------------------------------------------------------------

CHANGED_TOKEN = 300


@pytest.fixture(scope="module")
def bad(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from support.tinymodel import copy_gguf, write_tiny_llama

    root = tmp_path_factory.mktemp("robust-models")
    data = tiny_model.read_bytes()
    files = {"directory": root / "a-directory.gguf", "fifo": root / "a-fifo.gguf",
             "text": root / "text.gguf", "empty": root / "empty.gguf",
             "truncated": root / "truncated.gguf", "header": root / "header-only.gguf"}
    files["directory"].mkdir()
    os.mkfifo(files["fifo"])
    files["text"].write_text("this is not a model\n")
    files["empty"].write_bytes(b"")
    files["truncated"].write_bytes(data[: len(data) * 2 // 3])
    files["header"].write_bytes(data[:100])
    files["gemma3"] = copy_gguf(tiny_model, root / "gemma3.gguf", arch="gemma3")
    files["small_vocab"] = write_tiny_llama(root / "small-vocab.gguf", n_layer=2, n_merges=100)

    def change_token(name, value):
        if name == gguf.Keys.Tokenizer.LIST:
            value = list(value)
            value[CHANGED_TOKEN] = "Ġzzqx"
        return value

    files["other_token"] = copy_gguf(tiny_model, root / "other-token.gguf", edit=change_token)
    return files


@pytest.mark.slow
@pytest.mark.parametrize("kind, fragments", [
    ("directory", ["is not readable"]),
    ("fifo", ["is not readable"]),
    ("text", ["is not a GGUF file"]),
    ("empty", ["is not a GGUF file"]),
    ("truncated", ["is truncated"]),
    ("header", ["truncated GGUF header"]),
    ("gemma3", ["architecture 'gemma3' is not supported for layer slicing"]),
])
def test_bad_model_file(bad, cache_env, kind, fragments) -> None:
    res, elapsed = job(3, bad[kind], env=cache_env)
    assert_fails(res, elapsed, str(bad[kind]), *fragments, case=f"model {kind}")


# --- draft models ---------------------------------------------------------------------------

def test_draft_vocabulary_size_differs(tiny_model, bad, cache_env) -> None:
    res, elapsed = job(2, tiny_model, PROMPT, "--strategy", "pipeinfer", "-md",
                       bad["small_vocab"], env=cache_env)
    assert_fails(res, elapsed, "small-vocab.gguf", "tokens in its vocabulary but the target has",
                 "share one vocabulary", case="draft vocab size")


def test_draft_vocabulary_token_differs(tiny_model, bad, cache_env) -> None:
    res, elapsed = job(2, tiny_model, PROMPT, "--strategy", "speculative", "-md",
                       bad["other_token"], env=cache_env)
    assert_fails(res, elapsed, "other-token.gguf", f"disagree on token {CHANGED_TOKEN}",
                 "zzqx", case="draft token text")


@pytest.mark.parametrize("kind, fragment", [("missing", "model file not found"),
                                            ("text", "is not a GGUF file"),
                                            ("truncated", "is truncated")])
def test_draft_file_bad(tiny_model, bad, cache_env, tmp_path, kind, fragment) -> None:
    draft = tmp_path / "no-such-draft.gguf" if kind == "missing" else bad[kind]
    res, elapsed = job(2, tiny_model, PROMPT, "--strategy", "pipeinfer", "-md", draft,
                       env=cache_env)
    assert_fails(res, elapsed, "draft model (-md):", fragment, str(draft), case=f"draft {kind}")


def test_iterative_ignores_the_draft(tiny_model, bad, cache_env) -> None:
    """`--strategy iterative -md X` is fine: the draft is not used (nor checked)."""
    res, _ = job(2, tiny_model, PROMPT, "--strategy", "iterative", "-md", bad["other_token"],
                 env=cache_env)
    assert len(assert_ok(res)["tokens"]) == 16


@pytest.mark.parametrize("strategy", ["pipespec"])
def test_speculation_needs_a_draft(tiny_model, cache_env, strategy) -> None:
    """(speculative, pipeinfer and specpipe draft n-grams without one: tests/test_ngram.py,
    tests/test_ngram_specpipe.py)"""
    res, elapsed = job(2, tiny_model, PROMPT, "--strategy", strategy, env=cache_env)
    assert_fails(res, elapsed, f"strategy {strategy} needs a draft model (-md)",
                 case=f"{strategy} without -md")


# --- layer split and rank count ----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("split, fragments", [
    ("-0.5,1.5", ["--layer-split", "fractions must be finite and non-negative"]),
    ("0.5,nan", ["--layer-split", "fractions must be finite and non-negative"]),
    ("a,b", ["--layer-split", "is not a comma-separated list of numbers"]),
    ("0.3,0.3", ["layer split fractions sum to 0.6, not 1"]),
], ids=["negative", "nan", "non-numeric", "sum"])
def test_bad_layer_split(tiny_model, cache_env, split, fragments) -> None:
    res, elapsed = job(2, tiny_model, PROMPT, f"--layer-split={split}", env=cache_env)
    assert_fails(res, elapsed, *fragments, case=f"split {split}")


def test_more_ranks_than_layers(tiny_model, cache_env) -> None:
    res, elapsed = job(6, tiny_model, env=cache_env)
    assert_fails(res, elapsed, "6 ranks but the model has only 4 layers", case="6 ranks")


def test_bad_option_on_one_rank_only(tiny_model, cache_env) -> None:
    """MPMD launch where only rank 1's command line is bad: rank 1 must not simply exit (rank
    0 would wait for it in MPI_Init forever); the job ends with a message naming it."""
    marker = _marker()
    good = run_args(tiny_model, PROMPT, "--label", marker)
    cmd = mpmd_command([(1, good), (1, good + ["--layer-split=x"])])
    t0 = time.monotonic()
    res = launch(cmd, timeout=60, env=cache_env)
    elapsed = time.monotonic() - t0
    assert not _leftovers(marker)
    assert_fails(res, elapsed, f"rank 1 ({HOST})", "--layer-split", case="MPMD bad option")


# --- prompt, -n and -c ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("extra, fragments", [
    (["-n", "-5"], ["-n must be positive (got -5)"]),
    (["-n", "20", "-c", "16"], ["the context (-c 16) cannot hold the", "plus 20 to generate"]),
    (["-c", "0"], ["'-c' / '--ctx-size'", "0 is not in the range x>=1"]),
    (["-b", "0"], ["'-b' / '--batch-size'", "0 is not in the range x>=1"]),
], ids=["n-negative", "c-too-small", "c-zero", "b-zero"])
def test_bad_lengths(tiny_model, cache_env, extra, fragments) -> None:
    res, elapsed = job(2, tiny_model, PROMPT, *extra, n_predict=None, env=cache_env)
    assert_fails(res, elapsed, *fragments, case=" ".join(extra))


@pytest.mark.slow
def test_prompt_file_read_by_the_head_only(tiny_model, cache_env, tmp_path) -> None:
    """-f: only rank 0 reads the prompt file (workers' hosts need no copy); a missing one is
    reported once."""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPT)
    marker = _marker()
    head = run_args(tiny_model, None, "-f", prompt, "--label", marker)
    worker = run_args(tiny_model, None, "-f", tmp_path / "not-on-this-host.txt", "--label", marker)
    res = launch(mpmd_command([(1, head), (1, worker)]), timeout=60, env=cache_env)
    assert len(assert_ok(res)["tokens"]) == 16
    res, elapsed = job(2, tiny_model, None, "-f", tmp_path / "missing.txt", env=cache_env)
    assert_fails(res, elapsed, "cannot read prompt file", "missing.txt", case="-f missing")


# --- files pipeinfer writes -----------------------------------------------------------------

def test_stage_cache_is_a_file(tiny_model, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res, elapsed = job(2, tiny_model, env={"PIPEINFER_CACHE": str(blocker)})
    assert_fails(res, elapsed, f"stage cache {blocker}/stages is not writable (Not a directory)",
                 "set PIPEINFER_CACHE to a writable directory", case="cache is a file")


def test_stage_cache_under_proc(tiny_model) -> None:
    res, elapsed = job(2, tiny_model, env={"PIPEINFER_CACHE": "/proc/pipeinfer-cache"})
    assert_fails(res, elapsed, "stage cache /proc/pipeinfer-cache/stages is not writable",
                 case="cache under /proc")


def test_csv_is_a_directory(tiny_model, cache_env, tmp_path) -> None:
    res, elapsed = job(2, tiny_model, PROMPT, "--csv", tmp_path, env=cache_env)
    assert_fails(res, elapsed, "--csv", "is a directory", case="csv directory")


def test_csv_in_missing_directory(tiny_model, cache_env, tmp_path) -> None:
    path = tmp_path / "no-such-dir" / "results.csv"
    res, elapsed = job(2, tiny_model, PROMPT, "--csv", path, env=cache_env)
    assert_fails(res, elapsed, f"cannot write CSV file {path}: No such file or directory",
                 case="csv missing dir")


@pytest.mark.slow
def test_concurrent_runs_share_a_fresh_cache(tiny_model, tmp_path) -> None:
    """Two jobs slicing the same model into the same empty cache at the same time."""
    env = {"PIPEINFER_CACHE": str(tmp_path / "cache")}
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(job, 2, tiny_model, PROMPT, "--ignore-eos", n_predict=40, env=env)
                for _ in range(2)]
        first, second = (assert_ok(run.result()[0]) for run in runs)
    assert first["tokens"] == second["tokens"] and len(first["tokens"]) == 40
    stages = tmp_path / "cache" / "stages"
    assert len(list(stages.glob("*.gguf"))) == 2
    assert not list(stages.glob("*.tmp*")), list(stages.iterdir())


# --- ranks killed or interrupted ------------------------------------------------------------------

class LongJob:
    """A long generation under mpiexec, with output to files, that a test can disturb."""

    def __init__(self, model: Path, n_ranks: int, tmp_path: Path, env: dict, *extra: str):
        self.marker = _marker()
        args = run_args(model, f"{PROMPT} {self.marker}", "--ignore-eos", "-c", "8192",
                        "--label", self.marker, *extra, n_predict=5000, as_json=False)
        self.out, self.err = tmp_path / "stdout", tmp_path / "stderr"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(mpi_command(n_ranks, args), stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", **env})

    def ready_pids(self, timeout: float = 60.0) -> dict[int, int]:
        """rank -> pid of the process running it, from the head's `ready:` line (under the
        launcher, each is the child of the rank's supervisor: pipeinfer.job.supervisor)."""
        deadline = time.monotonic() + timeout
        while True:
            ready = re.search(r"^pipeinfer\[0\]: ready: (.*)$", self.output()[1], re.M)
            if ready:
                pairs = re.findall(r"rank (\d+) pid (\d+)", ready[1])
                return {int(rank): int(pid) for rank, pid in pairs}
            assert self.proc.poll() is None, f"the job ended early:\n{self.output()[1]}"
            assert time.monotonic() < deadline, "no ready line from the job"
            time.sleep(0.05)

    def wait_generating(self, n_bytes: int = 200, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.out.stat().st_size < n_bytes:
            assert self.proc.poll() is None, f"the job ended early:\n{self.err.read_text()}"
            assert time.monotonic() < deadline, "no output from the job"
            time.sleep(0.05)

    def wait(self, timeout: float) -> tuple[int | None, float]:
        t0 = time.monotonic()
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, time.monotonic() - t0

    def kill_all(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid in subprocess.run(["pgrep", "-f", self.marker], capture_output=True,
                                  text=True).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def output(self) -> tuple[str, str]:
        return self.out.read_text(errors="replace"), self.err.read_text(errors="replace")


@pytest.fixture
def long_job(tiny_model, tmp_path, cache_env):
    jobs: list[LongJob] = []

    def start(n_ranks: int, *extra: str, env: dict | None = None) -> LongJob:
        jobs.append(LongJob(tiny_model, n_ranks, tmp_path, {**cache_env, **(env or {})},
                            *extra))
        return jobs[-1]

    yield start
    for j in jobs:
        if j.proc.poll() is None or _leftovers(j.marker, 0):
            j.kill_all()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _gone(pid: int) -> bool:
    """No such process, or a zombie (reparented; its reaper may be slow)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("victim, sig", [(1, signal.SIGKILL), (2, signal.SIGKILL),
                                         (0, signal.SIGKILL), (1, signal.SIGTERM)],
                         ids=["rank1", "last-rank", "head", "rank1-sigterm"])
def test_rank_killed_mid_generation(long_job, victim, sig) -> None:
    """A rank killed by a signal (the OOM killer's SIGKILL, say): its supervisor names it in
    one line and ends the job, whose launcher then kills the other ranks' supervisors, and
    with them their ranks. (MPICH's own "BAD TERMINATION ... PID <pid>" names the first
    process it reaped, often a supervisor it killed while cleaning up.)"""
    j = long_job(3)
    j.wait_generating()
    ranks = j.ready_pids()
    assert sorted(ranks) == [0, 1, 2], ranks
    supervisors = {r: _parent(pid) for r, pid in ranks.items()}
    for r, sup in supervisors.items():  # each rank runs under a supervisor of the same command
        assert j.marker in Path(f"/proc/{sup}/cmdline").read_text(), (r, sup)
    pid = ranks[victim]
    time.sleep(1.0)
    os.kill(pid, sig)
    rc, elapsed = j.wait(timeout=30)
    out, err = j.output()
    assert rc is not None, "the job did not end within 30 s of the kill\n" + err
    assert rc != 0
    assert not _leftovers(j.marker)
    assert all(_gone(p) for p in [*ranks.values(), *supervisors.values()]), err
    assert "Traceback" not in out + err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    expected = (f"pipeinfer: error: rank {victim} ({HOST}, pid {pid}) was killed by signal "
                f"{int(sig)} ({sig.name}")
    assert len(errors) == 1 and errors[0].startswith(expected), err
    assert errors[0].endswith("; ending the job"), errors[0]
    assert ("out of memory?" in errors[0]) == (sig == signal.SIGKILL), errors[0]
    print(f"\n[{sig.name} rank {victim}] rc={rc}, job over {elapsed:.2f} s after the kill: "
          f"{errors[0]}")


def test_supervisor_killed(long_job) -> None:
    """The launcher kills what it started, the supervisors: their ranks die with them
    (PR_SET_PDEATHSIG), and nothing is left behind."""
    j = long_job(3)
    j.wait_generating()
    ranks = j.ready_pids()
    supervisors = [_parent(pid) for pid in ranks.values()]
    os.kill(supervisors[1], signal.SIGKILL)
    rc, elapsed = j.wait(timeout=30)
    out, err = j.output()
    assert rc is not None and rc != 0, err
    assert not _leftovers(j.marker)
    assert all(_gone(p) for p in [*ranks.values(), *supervisors]), err
    assert "Traceback" not in out + err
    print(f"\n[supervisor of rank 1 killed] rc={rc}, over {elapsed:.2f} s after the kill")


def test_supervisor_can_be_turned_off(long_job) -> None:
    """PIPEINFER_NO_SUPERVISOR=1: each rank runs in the process the launcher started."""
    j = long_job(3, env={"PIPEINFER_NO_SUPERVISOR": "1"})
    j.wait_generating()
    for rank, pid in j.ready_pids().items():
        assert Path(f"/proc/{_parent(pid)}/comm").read_text().strip() == "hydra_pmi_proxy"
    j.proc.send_signal(signal.SIGINT)
    rc, _ = j.wait(timeout=FAIL_LIMIT_S)
    assert rc is not None and rc != 0
    assert not _leftovers(j.marker)
    assert j.output()[1].count("pipeinfer: interrupted") == 1


@pytest.mark.parametrize("argv, env, wanted", [
    (["pipeinfer", "run"], {"PMI_RANK": "1", "PMI_SIZE": "3"}, True),
    (["pipeinfer", "run"], {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, True),
    (["pipeinfer", "run"], {"PMIX_RANK": "0"}, True),  # size unknown
    (["pipeinfer", "run"], {"SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, True),
    (["pipeinfer", "run"], {"PMI_RANK": "0", "PMI_SIZE": "1"}, False),  # one rank
    (["pipeinfer", "run"], {}, False),  # no launcher
    (["pipeinfer", "serve"], {"PMI_RANK": "1", "PMI_SIZE": "3"}, True),
    (["pipeinfer", "split"], {"PMI_RANK": "1", "PMI_SIZE": "3"}, False),
    (["pipeinfer", "run"], {"PMI_RANK": "1", "PMI_SIZE": "3", "PIPEINFER_NO_SUPERVISOR": "1"},
     False),
    (["pipeinfer", "run"], {"PMI_RANK": "1", "PMI_SIZE": "3", "PIPEINFER_NO_SUPERVISOR": "0"},
     True),
])
def test_supervisor_wanted(argv, env, wanted) -> None:
    from pipeinfer.job import supervisor

    assert supervisor.wanted(argv, env) is wanted


def test_killed_message() -> None:
    from pipeinfer.job.supervisor import killed_message

    assert killed_message(2, "node3", 4242, signal.SIGKILL) == (
        "pipeinfer: error: rank 2 (node3, pid 4242) was killed by signal 9 (SIGKILL; out of "
        "memory?); ending the job")
    assert killed_message(1, "h", 7, signal.SIGSEGV, core=True).endswith(
        "was killed by signal 11 (SIGSEGV, core dumped); ending the job")


@pytest.mark.slow
def test_sigint_mid_generation(long_job) -> None:
    j = long_job(3)
    j.wait_generating()
    time.sleep(1.0)
    j.proc.send_signal(signal.SIGINT)
    rc, elapsed = j.wait(timeout=FAIL_LIMIT_S)
    out, err = j.output()
    assert rc is not None, "ranks still running 10 s after SIGINT\n" + err
    assert rc != 0
    assert not _leftovers(j.marker)
    assert "Traceback" not in out + err and "Exception ignored" not in err, err
    assert err.count("pipeinfer: interrupted") == 1, err
    print(f"\n[SIGINT mid-generation] rc={rc}, over {elapsed:.2f} s after the signal")


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.3, 0.6, 1.0])
def test_sigint_during_startup(long_job, delay) -> None:
    """SIGINT while ranks import, start MPI or load stages: never a hang or a traceback."""
    j = long_job(3)
    time.sleep(delay)
    j.proc.send_signal(signal.SIGINT)
    rc, elapsed = j.wait(timeout=FAIL_LIMIT_S)
    out, err = j.output()
    assert rc is not None, f"ranks still running 10 s after SIGINT at {delay} s\n" + err
    assert rc != 0
    assert not _leftovers(j.marker)
    assert "Traceback" not in out + err and "Exception ignored" not in err, err
    assert err.count("pipeinfer: interrupted") <= 1, err
    print(f"\n[SIGINT at {delay} s] rc={rc}, over {elapsed:.2f} s after the signal")


# --- failures inside pipeinfer (fault injection) -----------------------------------------------

def _faulty(tiny_model, cache_env, fault: str, *extra: str):
    env = {**cache_env, **fault_env(PIPEINFER_TEST_FAULT=fault)}
    return job(3, tiny_model, PROMPT, "--ignore-eos", *extra, n_predict=200, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("fault, fragments", [
    ("decode:0:40", ["pipeinfer: error: internal error: RuntimeError: injected fault in decode",
                     "(run with -v for the traceback)"]),
    ("decode:1:40", [f"pipeinfer: error: rank 1 ({HOST}): internal error: RuntimeError: "
                     "injected fault in decode (run with -v for the traceback)"]),
    ("decode:2:40", [f"pipeinfer: error: rank 2 ({HOST}): internal error: RuntimeError: "
                     "injected fault in decode"]),
    ("load:1:0", [f"rank 1 ({HOST}): internal error: RuntimeError: injected fault in stage load"]),
    ("load:0:0", ["pipeinfer: error: internal error: RuntimeError: injected fault in stage load"]),
    ("stats:2:0", [f"rank 2 ({HOST}): internal error: RuntimeError: injected fault in shutdown"]),
], ids=["head-decode", "rank1-decode", "last-decode", "rank1-load", "head-load", "shutdown"])
def test_internal_error(tiny_model, cache_env, fault, fragments) -> None:
    res, elapsed = _faulty(tiny_model, cache_env, fault)
    assert_fails(res, elapsed, *fragments, case=f"fault {fault}")


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["decode:0:40", "decode:2:40", "load:1:0"])
def test_verbose_shows_tracebacks(tiny_model, cache_env, fault) -> None:
    res, elapsed = _faulty(tiny_model, cache_env, fault, "-v")
    assert res.rc != 0 and not res.timed_out and elapsed < FAIL_LIMIT_S, res.describe()
    assert "Traceback (most recent call last)" in res.stderr, res.describe()
    assert 'sitecustomize.py", line' in res.stderr  # the traceback reaches the fault
    assert len([line for line in res.stderr.splitlines()
                if line.startswith("pipeinfer: error: ")]) == 1, res.describe()


# --- limits reached during generation ---------------------------------------------------------

@pytest.mark.slow
def test_kv_cache_limit_stops_with_valid_output(tiny_model, tiny_draft_unrelated,
                                                cache_env) -> None:
    ref = assert_ok(job(2, tiny_model, PROMPT, "--ignore-eos", n_predict=80, env=cache_env)[0])
    kv_size = ref["n_prompt"] + 40
    res, _ = job(2, tiny_model, PROMPT, "--ignore-eos", "--strategy", "pipeinfer", "-md",
                 tiny_draft_unrelated, "--kv-size", str(kv_size), n_predict=80, env=cache_env)
    out = assert_ok(res)
    assert f"pipeinfer: stopped: the KV cache ({kv_size} cells, --kv-size) is full" in res.stderr
    assert out["stop_reason"] == "kv-cache"
    assert 0 < len(out["tokens"]) < 80
    assert out["tokens"] == ref["tokens"][:len(out["tokens"])]
    print(f"\n[kv-size {kv_size}] stopped after {len(out['tokens'])} of 80 tokens")


# --- soak -------------------------------------------------------------------------------------

SOAK_TOKENS = 2000


@pytest.mark.slow
def test_soak_pipeinfer_with_maximum_cancellations(tiny_model, tiny_draft_unrelated) -> None:
    """2000 tokens, 3 ranks, a draft that is almost always wrong: exact output, partitions all
    free at the end, and no rank's resident size growing after warm-up."""
    common = ("--ignore-eos", "-c", "4096")
    ref = assert_ok(job(3, tiny_model, PROMPT, *common, n_predict=SOAK_TOKENS, timeout=300)[0])
    res, elapsed = job(3, tiny_model, PROMPT, *common, "--strategy", "pipeinfer", "-md",
                       tiny_draft_unrelated, n_predict=SOAK_TOKENS, timeout=300)
    out = assert_ok(res)
    assert out["tokens"] == ref["tokens"] and len(out["tokens"]) == SOAK_TOKENS
    assert out["partitions_free"] is True
    assert out["runs_cancelled_invalidated"] + out["runs_cancelled_superfluous"] > 0
    growth = {}
    for stats in out["rank_stats"]:
        trace = stats["rss_trace_mb"]
        assert len(trace) >= 8, stats
        early, last = trace[len(trace) // 4], trace[-1]
        growth[stats["rank"]] = (last - early) / early
        assert growth[stats["rank"]] < 0.10, (stats["rank"], trace)
    print(f"\n[soak] {elapsed:.1f} s; rss growth from 25% to the end: "
          + ", ".join(f"rank {r} {g:+.1%}" for r, g in growth.items()))
