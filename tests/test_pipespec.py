"""The `pipespec` strategy (PipeSpec's k-model hierarchy): exact greedy output in-process under
scripted pipeline timing and through real mpiexec, with 2- and 3-model hierarchies; rollbacks
leave no stray KV entries; PipeSpec's analytic model (eq. 1-3) against hand-computed values."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import mpi_util
from pipeinfer.engine.drafting.hierarchy import (Hierarchy, Level, expectation, expected_tokens, geometric_tokens,
                                          rho_recursion, steady_state_rho)
from pipeinfer.schedule.buffers import merge
from pipeinfer.engine.drafting.hierarchy_remote import DraftRank, RemoteHierarchy
from pipeinfer.model.partition import StageRange
from pipeinfer.model.slicing import model_info, open_model, write_stage
from pipeinfer.model.stage import Stage, StageConfig
from pipeinfer.schedule.options import SpecOptions
from pipeinfer.engine.worker.local import LocalTransport
from support.rig import Rig, check_consistent
from support.stepped_transport import SteppedTransport
from support.tiny_set import N_BATCH, N_CTX, N_PREDICT, PROMPT

# hierarchies by name, smallest model first (the tiny target verifies the last)
HIERARCHIES = {
    "aligned": ("aligned",),
    "unrelated": ("unrelated",),
    "unrelated>aligned": ("unrelated", "aligned"),
    "first2>aligned": ("first2", "aligned"),
}


@pytest.fixture(scope="module")
def drafts(tiny, tmp_path_factory) -> dict[str, Path]:
    """The tiny drafts, plus a smaller one: the aligned draft's first 2 layers (and its
    output head)."""
    first2 = tmp_path_factory.mktemp("pipespec") / "aligned-first2.gguf"
    reader = open_model(tiny.aligned)
    write_stage(reader, model_info(reader, tiny.aligned), StageRange(0, 0, 2, True), first2,
                keep_tokenizer=True)
    return {"aligned": Path(tiny.aligned), "unrelated": Path(tiny.unrelated), "first2": first2}


class DraftStages:
    """Draft stages opened for one test (closed afterwards)."""

    def __init__(self, paths):
        config = StageConfig(n_ctx=4 * N_CTX, n_batch=N_BATCH, n_seq_max=1)
        self.stages = [Stage(p, config, final=True, label=f"draft {p.name}") for p in paths]

    def hierarchy(self, window: int) -> Hierarchy:
        for stage in self.stages:
            stage.clear()
        return Hierarchy(self.stages, N_BATCH, window)

    def close(self):
        for stage in self.stages:
            stage.close()


@pytest.fixture(scope="module")
def stage_sets(drafts):
    opened: dict[str, DraftStages] = {}

    def get(name: str) -> DraftStages:
        if name not in opened:
            opened[name] = DraftStages([drafts[d] for d in HIERARCHIES[name]])
        return opened[name]
    yield get
    for s in opened.values():
        s.close()


def run_pipespec(tiny, hier: Hierarchy, transport, spec=SpecOptions(), head_layers=1,
                 n_predict=N_PREDICT, **kw):
    with Rig(tiny, None, spec=spec, head_layers=head_layers) as rig:
        return rig.run("pipespec", draft=hier, transport=transport, spec=spec,
                       n_predict=n_predict, **kw)


def check_pipespec(out, hier: Hierarchy, reference, n_predict=N_PREDICT) -> None:
    check_consistent(out, reference, n_predict)
    accepted = list(out.gen.request.prompt) + out.gen.tokens
    for level in hier.levels:
        # no stray entries: sequence 0 holds a prefix of the accepted tokens, nothing else
        assert level.kv == accepted[:len(level.kv)]
        assert level.stage.seq_pos_max(0) == len(level.kv) - 1
        assert level.stage.seq_pos_max(0) < len(accepted)
        assert level.out == accepted
    rows = out.gen.extras["pipespec_stages"]
    assert len(rows) == len(hier.levels) + 1
    assert [r["role"] for r in rows] == ["draft"] + ["verify"] * (len(rows) - 2) + ["target"]
    for r in rows:
        assert 0 <= r["accepted"] <= r["proposed"] and r["rejections"] <= r["steps"]
    assert rows[0]["produced"] == rows[0]["steps"]
    assert rows[-1]["produced"] == n_predict
    expected = out.gen.extras["pipespec_expected"]
    assert len(expected["stages"]) == len(hier.levels)


# --- in-process exactness ------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(HIERARCHIES))
@pytest.mark.parametrize("delay", [0, 1, 3])
def test_local_transport_exact(tiny, stage_sets, name, delay):
    hier = stage_sets(name).hierarchy(4)
    out = run_pipespec(tiny, hier, lambda stages: LocalTransport(stages, delay=delay))
    check_pipespec(out, hier, tiny.reference)
    # (with one hierarchy step per target result, a 3-model hierarchy never fills a window:
    # its middle model waits for M0, and the target runs without speculation)
    if delay >= 3 or (delay and len(HIERARCHIES[name]) == 1):
        assert out.counters.runs_speculative > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HIERARCHIES))
@pytest.mark.parametrize("head_layers", [0, 1])
@pytest.mark.parametrize("lag", [0, 1, 2, 4])
@pytest.mark.parametrize("abort", [False, True], ids=["skip", "abort"])
def test_stepped_pipeline_exact(tiny, stage_sets, name, head_layers, lag, abort):
    hier = stage_sets(name).hierarchy(3)
    spec = SpecOptions(draft=3)
    out = run_pipespec(tiny, hier, lambda stages: SteppedTransport(stages, lag=lag, abort=abort,
                                                                   argmax=abort),
                       spec=spec, head_layers=head_layers)
    check_pipespec(out, hier, tiny.reference)
    c = out.counters
    if lag:
        assert c.runs_speculative > 0
    if name.startswith("unrelated") and name != "unrelated>aligned" and lag >= 2:
        assert c.runs_cancelled_invalidated > 0


def test_three_models_filter_and_accept(tiny, stage_sets):
    """The middle model (aligned) rejects most of the unrelated M0's tokens and corrects them;
    the target accepts most of what the middle model passes on."""
    hier = stage_sets("unrelated>aligned").hierarchy(4)
    out = run_pipespec(tiny, hier, lambda stages: SteppedTransport(stages, lag=3),
                       n_predict=64)
    check_pipespec(out, hier, tiny.reference, 64)
    m0, m1, target = out.gen.extras["pipespec_stages"]
    assert m1["proposed"] > 0 and m1["rate"] < 0.5
    assert m0["rollbacks"] > 0
    assert target["proposed"] > 0 and target["rate"] > 0.5


@pytest.mark.parametrize("n_predict", [1, 2, 5])
def test_few_tokens(tiny, stage_sets, n_predict):
    hier = stage_sets("first2>aligned").hierarchy(4)
    out = run_pipespec(tiny, hier, lambda stages: SteppedTransport(stages, lag=1),
                       n_predict=n_predict)
    check_consistent(out, tiny.reference, n_predict)


def test_end_of_generation_stops_exactly(tiny, stage_sets):
    k = next(i for i in range(6, len(tiny.reference)) if tiny.reference[i] not in
             tiny.reference[:i])
    eog = tiny.reference[k]
    hier = stage_sets("unrelated>aligned").hierarchy(4)
    out = run_pipespec(tiny, hier, lambda stages: SteppedTransport(stages, lag=2),
                       eog=lambda t: t == eog)
    assert out.gen.stop_reason == "eos"
    assert out.gen.tokens == list(tiny.reference[:k + 1])
    assert out.pool.all_free


def test_stops_cleanly_when_kv_cache_is_full(tiny, stage_sets):
    spec = SpecOptions(kv_size=len(tiny.prompt) + 40)
    hier = stage_sets("unrelated").hierarchy(4)
    out = run_pipespec(tiny, hier, lambda stages: SteppedTransport(stages, lag=4), spec=spec,
                       n_predict=100)
    tokens = out.gen.tokens
    assert out.gen.stop_reason == "kv-cache"
    assert 0 < len(tokens) < 40 and tokens == list(tiny.reference[:len(tokens)])
    assert out.pool.all_free


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from(list(HIERARCHIES)), window=st.integers(1, 6),
       max_runs=st.integers(2, 6), lag=st.integers(0, 5), abort=st.booleans(),
       script=st.lists(st.integers(0, 3), max_size=60), n_predict=st.integers(1, 40))
def test_property_exact(tiny, stage_sets, name, window, max_runs, lag, abort, script,
                        n_predict):
    """Any hierarchy, window, runs in flight and pipeline timing: greedy output stays exact
    and no draft KV entry beyond the accepted tokens remains."""
    spec = SpecOptions(draft=window, max_runs=max_runs)
    hier = stage_sets(name).hierarchy(window)
    out = run_pipespec(tiny, hier, lambda stages: SteppedTransport(
        stages, lag=lag, script=script, abort=abort, argmax=abort), spec=spec,
        n_predict=n_predict)
    check_pipespec(out, hier, tiny.reference, n_predict)


def test_temperature_same_tokens_as_iterative(tiny, stage_sets):
    """Sampling stays lossless: the target draws every position's token from its own
    distribution, once, in order, so a seed gives the iterative strategy's tokens."""
    from pipeinfer.model.sampling import SamplingParams

    accepted = 0
    with Rig(tiny, None) as rig:
        for seed in range(4):
            sampling = SamplingParams(0.8, 40, 0.95, seed)
            want = rig.run("iterative", sampling=sampling, n_predict=24).gen.tokens
            for name in ("aligned", "unrelated>aligned"):
                hier = stage_sets(name).hierarchy(3)
                out = rig.run("pipespec", draft=hier, sampling=sampling, n_predict=24,
                              transport=lambda stages: SteppedTransport(stages, lag=2))
                assert out.gen.tokens == want, (seed, name)
                assert out.pool.all_free
                accepted += out.counters.n_accepted
    assert accepted > 0


# --- the hierarchy alone ------------------------------------------------------------------------

def test_hierarchy_buffers_and_kv_stay_consistent(tiny, stage_sets):
    """Stepping a 3-model hierarchy with random target acceptances: after every step every
    buffer extends the next model's, and each model's KV holds a prefix of its buffer."""
    import random

    rnd = random.Random(0)
    hier = stage_sets("unrelated>aligned").hierarchy(3)
    accepted = list(tiny.prompt)
    hier.reset(accepted)
    full = list(tiny.full)
    for _ in range(300):
        if rnd.random() < 0.15:  # the target accepts the truth up to some point
            accepted = full[:min(len(full), len(accepted) + rnd.randint(1, 4))]
            hier.sync(accepted)
        else:
            hier.step(len(accepted) + 12)
        for lower, upper in zip(hier.levels, hier.levels[1:]):
            assert lower.out[:len(upper.out)] == upper.out
        assert hier.top.out[:len(accepted)] == accepted
        for level in hier.levels:
            assert level.kv == level.out[:len(level.kv)]
            assert level.stage.seq_pos_max(0) == len(level.kv) - 1
    assert hier.levels[1].stats.proposed > 0


def test_merge():
    assert merge([1, 2, 3], [1, 2]) == [1, 2, 3]
    assert merge([1, 2], [1, 2, 3]) == [1, 2, 3]
    assert merge([1, 5, 3], [1, 2]) == [1, 2]


# --- PipeSpec's analytic model (eq. 1-3) --------------------------------------------------------

def test_analytic_model_hand_computed():
    # alpha 0.5, gamma 3: a^(g+1) = 0.0625; (1 - 0.0625) / 0.5 = 1.875 tokens per verification;
    # rho = 0.5 / (1 - 0.0625 + 0.5) = 0.5 / 1.4375 = 0.347826...;
    # E[N] = (1 - rho) + rho * 1.875 = 1 + 0.875 * rho = 1.304347...
    assert geometric_tokens(0.5, 3) == pytest.approx(1.875)
    assert steady_state_rho(0.5, 3) == pytest.approx(0.5 / 1.4375)
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.875 * 0.5 / 1.4375)
    assert expected_tokens(0.5, 3) == pytest.approx(1.3043478, abs=1e-6)
    # alpha 0.8, gamma 4: a^5 = 0.32768; geometric (1 - 0.32768) / 0.2 = 3.3616;
    # rho = 0.8 / 1.47232 = 0.543360...; E = 1 + 2.3616 * rho = 2.283199...
    assert geometric_tokens(0.8, 4) == pytest.approx(3.3616)
    assert expected_tokens(0.8, 4) == pytest.approx(1 + 2.3616 * 0.8 / 1.47232)
    # the edges: nothing accepted -> one token per step; everything -> gamma + 1
    assert expected_tokens(0.0, 4) == pytest.approx(1.0)
    assert expected_tokens(1.0, 4) == pytest.approx(5.0)
    assert steady_state_rho(1.0, 4) == pytest.approx(1.0)


def test_rho_recursion_tends_to_the_steady_state():
    for alpha, gamma in ((0.5, 3), (0.8, 4), (0.2, 1)):
        rho = rho_recursion(alpha, gamma, 400)
        assert rho[0] == alpha
        assert rho[1] == pytest.approx(alpha * alpha ** (gamma + 1) + (1 - alpha) * alpha)
        assert sum(rho) / len(rho) == pytest.approx(steady_state_rho(alpha, gamma), abs=5e-3)
        assert rho[-1] == pytest.approx(steady_state_rho(alpha, gamma))


def test_expectation_from_stage_rows():
    rows = [{"model": "m0", "rate": None, "window": None, "step_s": 0.001},
            {"model": "m1", "rate": 0.5, "window": 3.0, "step_s": 0.01},
            {"model": "target", "rate": 0.8, "window": None, "step_s": 0.1}]
    out = expectation(rows, default_window=4)
    m1, target = out["stages"]
    assert m1["tokens_per_step"] == pytest.approx(1.3043478, abs=1e-5)
    assert m1["expected_tps"] == pytest.approx(130.43478, abs=1e-3)
    assert target["gamma"] == 4  # no measured window: the configured one
    assert target["tokens_per_step"] == pytest.approx(2.283199, abs=1e-5)
    assert out["speedup_vs_ar"] == target["tokens_per_step"]
    assert out["expected_tps"] == pytest.approx(22.83199, abs=1e-3)


# --- real MPI ranks ------------------------------------------------------------------------------

N_MPI = 40


def mpi_run(n_ranks, tiny, drafts_args, split, *extra, n_predict=N_MPI):
    md = [a for d in drafts_args for a in ("-md", str(d))]
    launch = mpi_util.run_pipeinfer(n_ranks, tiny.target, PROMPT, "--ignore-eos", *md,
                                    "--strategy", "pipespec", "--layer-split", split, *extra,
                                    n_predict=n_predict, timeout=120)
    assert launch.rc == 0 and not launch.timed_out, launch.describe()
    assert "Traceback" not in launch.stderr, launch.describe()
    return launch.json


@pytest.mark.slow
@pytest.mark.parametrize("name,split", [("aligned", "0,1"), ("unrelated>aligned", "0,1"),
                                        ("first2>aligned", "0,0.5,0.5"),
                                        ("unrelated", "0.25,0.75"),
                                        ("unrelated>aligned", "0.5,0.25,0.25"),
                                        ("first2>aligned", "1")])
def test_mpi_exact(tiny, drafts, name, split):
    chain = [drafts[d] for d in HIERARCHIES[name]]
    result = mpi_run(len(split.split(",")), tiny, chain, split)
    assert result["tokens"] == list(tiny.reference[:N_MPI])
    assert result["stop_reason"] == "length"
    assert result["partitions_free"] is True
    stages = result["pipespec_stages"]
    assert [s["model"] for s in stages] == [p.name for p in chain] + [tiny.target.name]
    assert result["draft"] == ",".join(p.name for p in chain)
    assert result["pipespec_expected"]["stages"]
    for s in result["rank_stats"][1:]:
        comps = s["computed"] + s["skipped"] + s["aborted"]
        assert comps == result["runs_started"], s


def test_mpi_other_strategies_use_the_first_draft(tiny, drafts):
    launch = mpi_util.run_pipeinfer(2, tiny.target, PROMPT, "--ignore-eos", "-md",
                                    drafts["aligned"], "-md", drafts["unrelated"],
                                    "--strategy", "pipeinfer", "--layer-split", "0,1",
                                    n_predict=N_MPI, timeout=120)
    assert launch.rc == 0, launch.describe()
    assert launch.json["tokens"] == list(tiny.reference[:N_MPI])
    assert "pipespec_stages" not in launch.json


# --- draft models on ranks of their own (hierarchy_remote.py) -----------------------------------

class ThreadNet:
    """An in-process stand-in for draft_link.DraftLink: one inbox per rank; draft ranks run
    in threads (llama.cpp releases the GIL while it computes)."""

    def __init__(self, ranks):
        self.inbox = {r: collections.deque() for r in [0, *ranks]}
        self.stats: dict[int, dict] = {}
        self.errors: list[BaseException] = []

    def endpoint(self, rank: int) -> "ThreadEndpoint":
        return ThreadEndpoint(self, rank)


class ThreadEndpoint:
    def __init__(self, net: ThreadNet, rank: int):
        self.net, self.rank = net, rank

    def send_draft(self, dest, kind, arg, tokens):
        self.net.inbox[dest].append((self.rank, kind, arg, list(tokens)))

    def poll_draft(self):
        try:
            return self.net.inbox[self.rank].popleft()
        except IndexError:
            return None

    def send_stats(self, stats):
        self.net.stats[self.rank] = stats

    def poll_stats(self, source):
        return self.net.stats.pop(source, None)

    def check_errors(self):
        if self.net.errors:
            raise RuntimeError(f"a draft rank failed: {self.net.errors[0]!r}")

    def flush(self, timeout=30.0):
        return True


class HeldTransport(LocalTransport):
    """LocalTransport whose first result waits (at most `limit` s) until `ready()` holds: the
    target then cannot finish before a draft rank thread has been scheduled at all."""

    def __init__(self, stages, delay: int, ready, limit: float = 60.0):
        super().__init__(stages, delay=delay)
        self.ready, self.deadline = ready, time.monotonic() + limit

    def poll_result(self):
        if not self.ready() and time.monotonic() < self.deadline:
            time.sleep(0.001)
            return None
        self.ready = lambda: True
        return super().poll_result()

    def result_waiting(self) -> bool:
        return self.ready() and super().result_waiting()


def run_remote(tiny, paths, transport, spec=SpecOptions(), head_layers=1, n_predict=N_PREDICT,
               hold=False):
    """pipespec with the draft models `paths` on draft 'ranks' 3.. (threads); returns the run,
    the draft ranks' levels and the last position each draft's sequence 0 holds (read before
    the stages close). With `hold`, `transport` gets a third argument: a check that the last
    draft rank has verified a proposal."""
    stages = DraftStages(paths)
    ranks = list(range(3, 3 + len(stages.stages)))
    net = ThreadNet(ranks)
    levels = [Level(s, N_BATCH) for s in stages.stages]
    threads = []
    for i, level in enumerate(levels):
        rank = DraftRank(net.endpoint(ranks[i]), level, i, ranks, spec.draft)

        def body(rank=rank):
            try:
                rank.run()
            except BaseException as err:  # seen by the head's check_errors
                net.errors.append(err)
        threads.append(threading.Thread(target=body, daemon=True))
    for t in threads:
        t.start()
    if hold:
        make, ready = transport, (lambda: levels[-1].stats.proposed > 0 or len(levels) == 1)
        transport = lambda st: make(st, ready)  # noqa: E731
    try:
        limit = len(tiny.prompt) + n_predict
        hier = RemoteHierarchy(net.endpoint(0), ranks, ahead=spec.draft * spec.max_runs,
                               limit=limit)
        out = run_pipespec(tiny, hier, transport, spec=spec, head_layers=head_layers,
                           n_predict=n_predict)
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert not net.errors, net.errors
        return out, levels, [level.stage.seq_pos_max(0) for level in levels]
    finally:
        stages.close()


@pytest.mark.parametrize("name", list(HIERARCHIES))
@pytest.mark.parametrize("delay", [0, 2])
def test_draft_ranks_exact(tiny, drafts, name, delay):
    chain = [drafts[d] for d in HIERARCHIES[name]]
    # held: on a loaded machine the target could otherwise finish before rank 4 ever runs
    out, levels, pos_max = run_remote(
        tiny, chain, lambda st, ready: HeldTransport(st, delay, ready), hold=True)
    check_consistent(out, tiny.reference, N_PREDICT)
    accepted = list(out.gen.request.prompt) + out.gen.tokens
    rows = out.gen.extras["pipespec_stages"]
    assert [r["model"] for r in rows] == [p.name for p in chain] + [tiny.target.name]
    for level, row, last in zip(levels, rows, pos_max):
        # every draft rank ended with its buffer = the output and no stray KV entries
        assert level.out == accepted
        assert level.kv == accepted[:len(level.kv)]
        assert last == len(level.kv) - 1
        assert row["kv_end"] == len(level.kv)
    assert rows[0]["produced"] > 0
    if len(levels) > 1:
        assert rows[1]["proposed"] > 0


def test_draft_rank_counts_an_end_that_came_before_its_stop(tiny, drafts):
    """M0 can take its STOP, finish and send END before M1 sees its own STOP (they come from
    different senders): M1 still ends once its STOP comes, with its KV trimmed to the output."""
    from pipeinfer.engine.drafting.hierarchy_remote import END, STOP, SYNC
    stages = DraftStages([drafts["aligned"]])
    try:
        net = ThreadNet([3, 4])
        level = Level(stages.stages[0], N_BATCH)
        rank = DraftRank(net.endpoint(4), level, 1, [3, 4], window=4)
        prompt = list(tiny.prompt)
        final = prompt + list(tiny.reference[:3])
        net.inbox[4].extend([(0, SYNC, len(prompt), prompt), (3, END, 0, []),
                             (0, STOP, 0, final)])
        done: list[dict] = []
        thread = threading.Thread(target=lambda: done.append(rank.run()), daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "M1 waits for an END it already took in"
        assert done[0]["kv_end"] <= len(final) and level.out == final
        assert [m[:2] for m in net.inbox[3]] == [(4, END)]  # and M0 hears M1 end
    finally:
        stages.close()


@pytest.mark.parametrize("lag", [1, 3])
def test_draft_ranks_stepped_pipeline(tiny, drafts, lag):
    spec = SpecOptions(draft=3)
    chain = [drafts[d] for d in HIERARCHIES["unrelated>aligned"]]
    out, _, _ = run_remote(tiny, chain,
                           lambda st: SteppedTransport(st, lag=lag, abort=True, argmax=True),
                           spec=spec, head_layers=0)
    check_consistent(out, tiny.reference, N_PREDICT)


def n_ranks_of(split: str) -> int:
    target, *drafts = split.split("/")
    return len(target.split(",")) + len(drafts)


@pytest.mark.slow
@pytest.mark.parametrize("name,split", [("aligned", "0,1/1"), ("unrelated>aligned", "0,1/1/1"),
                                        ("first2>aligned", "0.5,0.5/1/1"),
                                        ("unrelated", "1/1"),
                                        ("first2>aligned", "0,0.5,0.5/1/1")])
def test_mpi_draft_ranks_exact(tiny, drafts, name, split):
    chain = [drafts[d] for d in HIERARCHIES[name]]
    result = mpi_run(n_ranks_of(split), tiny, chain, split)
    assert result["tokens"] == list(tiny.reference[:N_MPI])
    assert result["partitions_free"] is True
    assert result["draft_ranks"] == len(chain) and result["n_ranks"] == n_ranks_of(split)
    assert result["split"].endswith("/1" * len(chain))
    stages = result["pipespec_stages"]
    assert [s["model"] for s in stages] == [p.name for p in chain] + [tiny.target.name]
    accepted = len(result["prompt_tokens"]) + len(result["tokens"])
    for s in stages[:-1]:
        assert 0 < s["kv_end"] <= accepted  # trimmed to the output: no stray draft entries
    assert stages[0]["produced"] > 0
    # the target's ranks only: the draft ranks take no pipeline work
    assert len(result["rank_stats"]) == len(split.split("/")[0].split(","))


@pytest.mark.parametrize("split,strategy,n_md,fragment", [
    ("0,1/1", "pipeinfer", 1, "for --strategy pipespec only"),
    ("0,1/1", "pipespec", 2, "1 draft rank(s) but 2 draft model(s)"),
    ("0,1/1/1", "pipespec", 1, "2 draft rank(s) but 1 draft model(s)"),
    ("0,0.5,0.5/1", "pipespec", 1, "in all, but the job has 3 ranks"),
    ("0,1/0.5", "pipespec", 1, "after '/' give 1 per draft model"),
])
def test_mpi_draft_ranks_refused(tiny, drafts, split, strategy, n_md, fragment):
    md = [a for d in [drafts["aligned"]] * n_md for a in ("-md", str(d))]
    launch = mpi_util.run_pipeinfer(3, tiny.target, PROMPT, *md, "--strategy", strategy,
                                    "--layer-split", split, n_predict=8, timeout=60)
    assert launch.rc != 0 and not launch.timed_out, launch.describe()
    # one message (the command-line check's comes as click's "Error: Invalid value ...")
    assert launch.stderr.count(fragment) == 1, launch.describe()
    assert len(mpi_util.error_lines(launch.stderr)) <= 1, launch.describe()
    assert "Traceback" not in launch.stderr
