"""Calibration and `--layer-split auto` under the real mpiexec on the tiny model: a 2-rank
`pipeinfer calibrate` writes a well-formed profile; `run --layer-split auto` measures when it
has no profile, reuses the one given, and refuses a profile of another model in one line."""

from __future__ import annotations

import json
import logging

import pytest

from pipeinfer.plan.cost import PREFILL_STEP, STEP_SIZES
from pipeinfer.plan.profile import load
from support.cluster import CLUSTER, needs_cgroups
from support.mixed_quants import write_mixed
from support.mpi_util import MPIEXEC, PIPEINFER, PYTHON, launch, run_pipeinfer

TIMEOUT = 120


@pytest.fixture(scope="module")
def profile2(tiny_model, tiny_draft_aligned, tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "p2.json"
    out = launch([MPIEXEC, "-n", "2", PIPEINFER, "calibrate", "-m", tiny_model,
                  "-md", tiny_draft_aligned, "--profile", path], timeout=TIMEOUT)
    assert out.rc == 0, out.describe()
    return path, out


def test_two_rank_calibration_writes_a_well_formed_profile(profile2, tiny_model):
    path, out = profile2
    data = json.loads(path.read_text())
    assert [n["rank"] for n in data["nodes"]] == [0, 1]
    assert data["model"]["name"] == tiny_model.name and data["model"]["n_layer"] == 4
    for node in data["nodes"]:
        assert sorted(int(b) for b in node["layer_ms"]) == [*STEP_SIZES, PREFILL_STEP]
        assert sorted(int(b) for b in node["output_ms"]) == list(STEP_SIZES)
        assert all(ms > 0 for ms in node["layer_ms"].values())
        assert all(ms >= 0 for ms in node["output_ms"].values())
        assert node["free_mb"] > 0 and node["link_rtt_ms"] > 0 and node["link_mb_s"] > 0
        assert 0 < node["cores"] <= 64
    assert data["nodes"][0]["draft_ms"] > 0 and data["nodes"][1]["draft_ms"] == 0
    assert data["draft"]["name"].startswith("tiny-draft")
    assert load(path).nodes[1].layer_ms[8] == data["nodes"][1]["layer_ms"]["8"]
    assert f"profile: {path}" in out.stdout


@pytest.mark.slow
@needs_cgroups
def test_calibration_records_each_rank_s_cpu_quota(tiny_model, tmp_path):
    # the simulator charges a head with little more than a core for its loop: it must know
    path = tmp_path / "quota.json"
    out = launch([PYTHON, CLUSTER, "--nodes", "2", "--cpus", "0.5,0.25", "--", PIPEINFER, "calibrate", "-m",
                  tiny_model, "--profile", path], timeout=TIMEOUT)
    assert out.rc == 0, out.describe()
    assert [n.cores for n in load(path).nodes] == [0.5, 0.25]
    assert [n.cost().cores for n in load(path).nodes] == [0.5, 0.25]


def test_auto_split_measures_then_reuses_the_profile(tiny_model, tmp_path):
    path = tmp_path / "p3.json"
    first = run_pipeinfer(3, tiny_model, "def main():", "--layer-split", "auto",
                          "--profile", path, "--ignore-eos", n_predict=8, timeout=TIMEOUT)
    assert first.rc == 0, first.describe()
    assert "calibrated in" in first.stderr and "--layer-split auto:" in first.stderr
    assert len(load(path).nodes) == 3 and len(first.json["tokens"]) == 8
    again = run_pipeinfer(3, tiny_model, "def main():", "--layer-split", "auto",
                          "--profile", path, "--ignore-eos", n_predict=8, timeout=TIMEOUT)
    assert again.rc == 0, again.describe()
    assert "calibrated in" not in again.stderr and "--layer-split auto:" in again.stderr
    assert again.json["tokens"] == first.json["tokens"]


def test_a_profile_of_another_model_is_refused(profile2, tmp_path):
    from support.tinymodel import write_tiny_llama
    other = write_tiny_llama(tmp_path / "other.gguf", n_layer=4, seed=11)
    out = run_pipeinfer(2, other, "x", "--layer-split", "auto", "--profile", profile2[0],
                        n_predict=4, timeout=TIMEOUT)
    assert out.rc != 0 and "Traceback" not in out.stderr
    errors = [l for l in out.stderr.splitlines() if l.startswith("pipeinfer: error:")]
    assert len(errors) == 1 and "was measured for the model" in errors[0], out.describe()


def _profile_with_a_slow_rank(path, model, slow: int, n: int = 3):
    """A hand-made profile of this host's `n` ranks in which rank `slow` takes 100x longer a
    layer: the solver leaves it out."""
    import socket

    from pipeinfer.model.stage_cache import content_digest
    from pipeinfer.plan.profile import ModelId, NodeFigures, Profile

    nodes = tuple(NodeFigures(r, socket.gethostname(), 1,
                              {1: 100.0 if r == slow else 1.0, 8: 800.0 if r == slow else 8.0},
                              {1: 1.0, 8: 8.0}, 10000.0, 0.1, 1000.0) for r in range(n))
    Profile(ModelId(model.name, content_digest(model)[:32], 4), None, nodes).save(path)


@pytest.mark.slow
@pytest.mark.parametrize("slow, layers", [(2, [2, 2, 0]), (1, [2, 0, 2])])
def test_a_rank_left_out_of_the_chain(tiny_model, tmp_path, slow, layers):
    path = tmp_path / f"slow{slow}.json"
    _profile_with_a_slow_rank(path, tiny_model, slow)
    even = run_pipeinfer(3, tiny_model, "def main():", "--layer-split", "0.5,0.25,0.25",
                         "--ignore-eos", n_predict=8, timeout=TIMEOUT)
    auto = run_pipeinfer(3, tiny_model, "def main():", "--layer-split", "auto", "--profile",
                         path, "--ignore-eos", n_predict=8, timeout=TIMEOUT)
    assert auto.rc == 0, auto.describe()
    assert [b - a for a, b in auto.json["layer_split"]] == layers
    assert f"rank {slow} (" in auto.stderr and "out of the chain" in auto.stderr
    assert auto.json["tokens"] == even.json["tokens"]


@pytest.fixture(scope="module")
def convertible_draft(tmp_path_factory):
    """A tiny draft with Q8_0/Q5 matrices: `run` loads its compact (Q4_0) copy by default."""
    from support.tinymodel import write_tiny_llama

    d = tmp_path_factory.mktemp("convertible")
    f32 = write_tiny_llama(d / "f32.gguf", n_layer=2, seed=5)
    return write_mixed(f32, d / "mixed-draft.gguf")


@pytest.mark.slow
@pytest.mark.parametrize("flag,compacted", [([], True), (["--no-compact-draft"], False)])
def test_calibration_times_the_draft_run_will_load(tiny_model, convertible_draft, tmp_path,
                                                   flag, compacted):
    """The profile's draft is the file `run` loads: its compact copy unless
    --no-compact-draft (timing the original overstated the head's drafting 1.5x)."""
    path = tmp_path / "p.json"
    out = launch([MPIEXEC, "-n", "2", PIPEINFER, "calibrate", "-m", tiny_model, "-md",
                  convertible_draft, "--profile", path, *flag], timeout=TIMEOUT,
                 env={"PIPEINFER_CACHE": str(tmp_path / "cache")})
    assert out.rc == 0, out.describe()
    name = json.loads(path.read_text())["draft"]["name"]
    assert (name != convertible_draft.name) == compacted
    if compacted:
        assert (tmp_path / "cache" / "compact" / name).exists()


def test_an_outdated_cached_profile_is_measured_again(tmp_path, caplog):
    # a cached profile without the 3-token step or the ranks' CPU (older versions) is not
    # used: auto measures again; one given with --profile is used, with a warning
    from pipeinfer.plan.auto import _read
    from pipeinfer.plan.profile import ModelId, NodeFigures, Profile
    caplog.set_level(logging.INFO, logger="pipeinfer")

    def profile(steps, cores):
        nodes = tuple(NodeFigures(r, f"h{r}", 1, {b: 1.0 for b in steps},
                                  {b: 0.5 for b in steps}, 1000.0, cores=cores)
                      for r in range(2))
        return Profile(ModelId("m.gguf", "abc", 4), None, nodes)

    mid, hosts = ModelId("m.gguf", "abc", 4), ["h0", "h1"]
    cached = tmp_path / "cached.json"
    for steps, cores, why in (((1, 2, 4, 8), 1.0, "steps of [3] tokens"),
                              (STEP_SIZES, 0.0, "the ranks' CPU")):
        profile(steps, cores).save(cached)
        assert _read(None, cached, mid, hosts) is None
        assert why in caplog.text
        assert _read(str(cached), cached, mid, hosts) is not None   # given: used, warned
    profile(STEP_SIZES, 0.5).save(cached)
    assert _read(None, cached, mid, hosts).nodes[1].cores == 0.5
