"""`pipeinfer simulate` and `pipeinfer plan` as a user runs them (one process, no MPI) on the
tiny models: JSON with the predicted figures, the plan's command lines, a header-only GGUF
costed from a reference model, and one clear error line for impossible settings."""

from __future__ import annotations


import pytest

from support.mpi_util import PIPEINFER, launch
from pipeinfer.plan import header_only
from pipeinfer.plan.profile import ModelId, NodeFigures, Profile
from pipeinfer.model.stage_cache import content_digest


def pipeinfer(*args, timeout=120):
    return launch([PIPEINFER, *map(str, args)], timeout=timeout)


def test_simulate_prints_speed_ttft_and_itl(tiny_model, tiny_draft_aligned):
    out = pipeinfer("simulate", "--nodes", 3, "--cpu", 0.5, "-m", tiny_model,
                    "-md", tiny_draft_aligned, "--strategy", "pipeinfer", "-n", 16, "--json")
    assert out.rc == 0, out.describe()
    result = out.json
    assert result["speed_tps"] > 0 and result["ttft_s"] > 0 and result["itl_s"] > 0
    # run's default split: the head drafts, the stages are of equal weight
    assert result["layers"][0] == 0 and sum(result["layers"]) == 4
    assert result["n_generated"] == 16
    assert 0 <= result["assumed_accept_rate"] <= 1  # from the probe (no --accept-rate)


def test_simulate_is_deterministic_and_auto_is_no_slower(tiny_model):
    args = ["simulate", "--cpus", "1,1,0.25", "-m", tiny_model, "--strategy", "iterative",
            "-n", 16, "--json"]
    even, again = pipeinfer(*args, "--layer-split", "0.5,0.25,0.25"), \
        pipeinfer(*args, "--layer-split", "0.5,0.25,0.25")
    auto = pipeinfer(*args, "--layer-split", "auto")
    assert even.json == again.json, even.describe()
    assert auto.json["speed_tps"] >= even.json["speed_tps"]


def test_a_header_only_model_is_costed_from_the_reference(tiny_model, tmp_path):
    big = tmp_path / "big.gguf"
    header_only.write(big, header_only.Dims("big", 8, 256, 512, 4, 2, 600))
    out = pipeinfer("simulate", "--nodes", 4, "--cpu", 0.5, "-m", big, "--reference",
                    tiny_model, "--strategy", "iterative", "-n", 8, "--json")
    assert out.rc == 0, out.describe()
    assert out.json["layers"] == [2, 2, 2, 2] or sum(out.json["layers"]) == 8


def test_plan_names_the_hosts_and_the_command(tiny_model, tiny_draft_aligned, tmp_path):
    fast = {1: 1.0, 8: 2.0, 128: 9.0}
    nodes = tuple(NodeFigures(r, f"host{r}", 1, {b: ms * (10 if r == 3 else 1)
                                                  for b, ms in fast.items()},
                              {1: 0.5, 8: 1.0}, 10000.0, 0.2, 100.0,
                              draft_ms=0.5 if r == 0 else 0.0) for r in range(4))
    profile = tmp_path / "p.json"
    Profile(ModelId(tiny_model.name, content_digest(tiny_model)[:32], 4), None, nodes).save(
        profile)
    out = pipeinfer("plan", "--profile", profile, "-m", tiny_model, "-md", tiny_draft_aligned,
                    "--accept-rate", 0.8, "-n", 16)
    assert out.rc == 0, out.describe()
    assert "mpiexec -n 3 -hosts host0,host1,host2 pipeinfer run" in out.stdout  # host3 is out
    assert "left out (they would only slow it): host3:3" in out.stdout
    for strategy in ("iterative", "speculative", "pipeinfer"):
        assert f"--strategy {strategy}" in out.stdout
    # the command names the draft file given (run makes its compact copy), not the copy
    assert out.stdout.count(f"-md {tiny_draft_aligned} --strategy") == 2, out.stdout
    loose = pipeinfer("plan", "--profile", profile, "-m", tiny_model, "-md", tiny_draft_aligned,
                      "--accept-rate", 0.8, "-n", 16, "--no-compact-draft")
    assert loose.stdout.count(f"-md {tiny_draft_aligned} --no-compact-draft --strategy") == 2


@pytest.mark.parametrize("args, message", [
    (["--nodes", 9, "--cpu", 0.5, "--strategy", "iterative"],
     "9 nodes but the model has only 4 layers"),
    (["--cpus", "1,1", "--nodes", 2, "--strategy", "iterative"],
     "either --cpus or --nodes/--cpu"),
    (["--nodes", 2, "--link", "fast", "--strategy", "iterative"], "--link 'fast'"),
    (["--nodes", 2, "--strategy", "pipeinfer"], "needs a draft model (-md)"),
    (["--nodes", 3, "--layer-split", "0.5,0.5", "--strategy", "iterative"],
     "2 fractions for 3 nodes"),
])
def test_simulate_refuses_impossible_settings(tiny_model, args, message):
    out = pipeinfer("simulate", "-m", tiny_model, *args)
    errors = [l for l in out.stderr.splitlines() if l.startswith("pipeinfer: error:")]
    assert out.rc != 0 and len(errors) == 1 and message in errors[0], out.describe()
    assert "Traceback" not in out.stderr


def test_a_profile_of_another_model_is_refused(tiny_model, tmp_path):
    nodes = (NodeFigures(0, "h", 1, {1: 1.0}, {1: 1.0}, 1000.0),)
    profile = tmp_path / "other.json"
    Profile(ModelId("other.gguf", "0" * 32, 4), None, nodes).save(profile)
    out = pipeinfer("plan", "--profile", profile, "-m", tiny_model, "--strategy", "iterative")
    errors = [l for l in out.stderr.splitlines() if l.startswith("pipeinfer: error:")]
    assert out.rc != 0 and len(errors) == 1 and "measured for the model other.gguf" in errors[0]


def test_a_profile_without_auto_is_refused(tiny_model, tmp_path):
    out = launch([PIPEINFER, "run", "-m", tiny_model, "-p", "x", "--profile",
                  tmp_path / "p.json"], timeout=60)
    errors = [l for l in out.stderr.splitlines() if l.startswith("pipeinfer: error:")]
    assert out.rc == 2 and len(errors) == 1 and "--layer-split auto only" in errors[0]


def test_plan_from_a_hostfile(tiny_model, tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("# the cluster\nalpha:2\nbeta slots=1\n\ngamma  # the last\n")
    out = pipeinfer("plan", "--hostfile", hostfile, "--cpu", 0.5, "-m", tiny_model,
                    "--strategy", "iterative", "--json")
    assert out.rc == 0, out.describe()
    assert len(out.json["layers"]) == 4  # one node per slot: alpha, alpha, beta, gamma
    kept = [["alpha", "alpha", "beta", "gamma"][r] for r in out.json["nodes_used"]]
    assert f"mpiexec -n {len(kept)} -hosts {','.join(kept)} pipeinfer run" in out.json["command"]


@pytest.mark.parametrize("hosts, message", [
    ("alpha:0\n", "line 1: 'alpha:0' is not 'host', 'host:N' or 'host slots=N'"),
    ("# nothing\n", "names no host"),
])
def test_a_bad_hostfile_is_named(tiny_model, tmp_path, hosts, message):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(hosts)
    out = pipeinfer("plan", "--hostfile", hostfile, "-m", tiny_model, "--strategy", "iterative")
    errors = [l for l in out.stderr.splitlines() if l.startswith("pipeinfer: error:")]
    assert out.rc != 0 and len(errors) == 1 and message in errors[0], out.describe()


def test_memory_that_cannot_hold_the_split_is_named(tiny_model):
    # 250 MB of every node is the runtime's: node 1 has 1 MB for layers of ~2 MB (their KV
    # cache of 8192 cells) and the output layer, not the 2 layers the split gives it
    out = pipeinfer("simulate", "--nodes", 2, "-m", tiny_model, "--strategy", "iterative",
                    "--layer-split", "0.5,0.5", "--memory", "10000,251")
    errors = [l for l in out.stderr.splitlines() if l.startswith("pipeinfer: error:")]
    assert out.rc != 0 and len(errors) == 1, out.describe()
    assert "node 1 (node1) has 251 MB free" in errors[0] and "not 2" in errors[0]
    # plan's solver gives node 1 nothing and node 0 all, or says what is missing
    out = pipeinfer("plan", "--nodes", 2, "-m", tiny_model, "--strategy", "iterative",
                    "--memory", "10000,251", "--json")
    assert out.rc == 0 and out.json["layers"] == [4, 0], out.describe()
    out = pipeinfer("plan", "--nodes", 2, "-m", tiny_model, "--strategy", "iterative",
                    "--memory", "251")
    errors = [l for l in out.stderr.splitlines() if l.startswith("pipeinfer: error:")]
    assert out.rc != 0 and len(errors) == 1 and "add memory or nodes" in errors[0], \
        out.describe()
