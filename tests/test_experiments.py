"""The experiment runner (experiments/run_experiments.py) and the charts (plot.py), end to end:
the smoke config through the real mpiexec on the tiny models, then plot.py on its CSV."""

from __future__ import annotations

import csv
import re
import textwrap
from pathlib import Path

import pytest

from support.mpi_util import PYTHON, launch

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "experiments" / "run_experiments.py"
PLOT = ROOT / "plot.py"
CONFIGS = ROOT / "experiments" / "configs"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SMOKE_VARIANTS = ["iterative", "speculative", "pipeinfer", "pipeinfer-nocancel",
                  "pipeinfer-nocontinuous"]
SMOKE_PROMPTS = ["chat", "plain"]


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def label(row: dict) -> dict:
    return dict(piece.split("=", 1) for piece in row["label"].split(";"))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, tiny_model, tiny_draft_aligned):
    out = tmp_path_factory.mktemp("smoke") / "smoke.csv"
    result = launch([PYTHON, RUNNER, CONFIGS / "smoke.toml", "--out", out,
                     "--set", f"target={tiny_model}", "--set", f"draft={tiny_draft_aligned}"],
                    timeout=600)
    return result, out


def test_smoke_config_runs_end_to_end(smoke):
    result, out = smoke
    assert result.rc == 0, result.describe()
    rows = read_csv(out)
    n_runs = len(SMOKE_VARIANTS) * len(SMOKE_PROMPTS)
    assert len(rows) == n_runs
    # the paper's order: every prompt runs iterative -> speculative -> pipeinfer -> ablations
    got = [(label(r)["prompt"], label(r)["variant"]) for r in rows]
    assert got == [(p, v) for p in SMOKE_PROMPTS for v in SMOKE_VARIANTS]
    for row in rows:
        lab = label(row)
        assert lab["pair"] == "tiny" and lab["setting"] == "2n"
        assert row["strategy"] == ("pipeinfer" if lab["variant"].startswith("pipeinfer")
                                   else lab["variant"])
        assert row["ranks"] == "2"
        assert row["n_generated"] == "16"  # --ignore-eos, n_predict = 16
        assert float(row["speed_tps"]) > 0 and float(row["itl_s"]) > 0
        assert row["target"] == Path(row["target"]).name  # as pipeinfer writes it
        if row["strategy"] == "iterative":
            assert row["draft"] == "" and row["accept_rate"] == ""
        elif row["strategy"] == "speculative" or row["accept_rate"]:
            assert row["draft"] and 0 <= float(row["accept_rate"]) <= 1
        else:  # pipeinfer drafting on its own thread may find nothing worth starting in a
            # run this short (16 tokens, a pipeline as fast as the draft): no rate then
            assert row["draft"] and row["strategy"].startswith("pipeinfer")
    # one progress line per run, with its speed
    progress = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert len(progress) == n_runs
    assert all(" t/s" in line for line in progress), result.stdout
    assert f"{n_runs} of {n_runs} run(s) succeeded" in result.stdout


def test_plot_writes_pngs_from_smoke_csv(smoke, tmp_path):
    result, csv_path = smoke
    assert result.rc == 0, result.describe()
    out = tmp_path / "figures"
    plot = launch([PYTHON, PLOT, csv_path, "--out", out], timeout=120)
    assert plot.rc == 0, plot.describe()
    for name in ("speed", "ttft", "itl", "ablation", "acceptance", "verified_acceptance"):
        png = out / f"{name}.png"
        assert png.is_file(), f"{name}.png missing; {plot.describe()}"
        data = png.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_SIGNATURE)
    assert "pipeinfer-nocancel" in plot.stdout  # the summary table


def test_plot_without_ablation_or_acceptance(tmp_path, smoke):
    """Only iterative rows: the three main charts, no ablation.png / acceptance.png."""
    _, csv_path = smoke
    rows = [r for r in read_csv(csv_path) if r["strategy"] == "iterative"]
    only = tmp_path / "iterative.csv"
    with open(only, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = launch([PYTHON, PLOT, only, "--out", tmp_path / "fig"], timeout=120)
    assert result.rc == 0, result.describe()
    assert sorted(p.name for p in (tmp_path / "fig").iterdir()) == \
        ["itl.png", "speed.png", "summary.txt", "ttft.png"]


def test_plot_summary_has_spread_and_ratios_to_iterative(tmp_path):
    """Two repeats per strategy with known values: summary.txt (and stdout) give the mean, the
    standard deviation and the ratios to iterative of the same prompt and setting."""
    path = tmp_path / "results.csv"
    rows = [("iterative", 4.0, 0.2, ""), ("iterative", 6.0, 0.2, ""),
            ("pipeinfer", 7.0, 0.3, "0.5"), ("pipeinfer", 8.0, 0.3, "0.7")]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["strategy", "speed_tps", "ttft_s", "itl_s", "accept_rate", "label"])
        for strategy, speed, ttft, accept in rows:
            writer.writerow([strategy, speed, ttft, 1 / speed, accept,
                             f"pair=p;prompt=code;setting=4n;variant={strategy}"])
    result = launch([PYTHON, PLOT, path, "--out", tmp_path / "fig"], timeout=120)
    assert result.rc == 0, result.describe()
    table = (tmp_path / "fig" / "summary.txt").read_text()
    assert table.strip() in result.stdout
    lines = {line.split()[3]: line.split() for line in table.splitlines()[1:]}
    # pair prompt setting variant n speed ±sd TTFT ±sd ITL ±sd accept [±sd] x-iter TTFT-x-iter
    assert lines["iterative"][4:7] == ["2", "5.00", "±1.41"]
    assert lines["iterative"][-2:] == ["1.00", "1.00"]
    assert lines["pipeinfer"][4:9] == ["2", "7.50", "±0.71", "300", "±0"]
    assert lines["pipeinfer"][-4:] == ["0.60", "±0.14", "1.50", "1.50"]


def test_plot_summary_and_chart_of_verified_acceptance(tmp_path):
    """A CSV with verified_accept_rate (runs cancelled before verification): the summary gains
    a last column with its mean +- std, and verified_acceptance.png is drawn; a CSV without the
    column (older runs) keeps the table without it."""
    path = tmp_path / "results.csv"
    rows = [("iterative", "", ""), ("pipeinfer", "0.50", "0.80"), ("pipeinfer", "0.70", "0.90")]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["strategy", "speed_tps", "ttft_s", "itl_s", "accept_rate",
                         "verified_accept_rate", "label"])
        for strategy, accept, verified in rows:
            writer.writerow([strategy, 5.0, 0.2, 0.2, accept, verified,
                             f"pair=p;prompt=code;setting=4n;variant={strategy}"])
    result = launch([PYTHON, PLOT, path, "--out", tmp_path / "fig"], timeout=120)
    assert result.rc == 0, result.describe()
    table = (tmp_path / "fig" / "summary.txt").read_text().splitlines()
    assert table[0].split()[-1] == "verified"
    lines = {line.split()[3]: line.split() for line in table[1:]}
    assert lines["pipeinfer"][-2:] == ["0.85", "±0.07"]
    assert lines["iterative"][-1] == "-"
    png = tmp_path / "fig" / "verified_acceptance.png"
    assert png.read_bytes().startswith(PNG_SIGNATURE)

    older = tmp_path / "older.csv"
    older.write_text("\n".join(",".join(line.split(",")[:5] + line.split(",")[6:])
                               for line in path.read_text().splitlines()) + "\n")
    result = launch([PYTHON, PLOT, older, "--out", tmp_path / "old"], timeout=120)
    assert result.rc == 0, result.describe()
    assert "verified" not in (tmp_path / "old" / "summary.txt").read_text()
    assert not (tmp_path / "old" / "verified_acceptance.png").exists()
    assert (tmp_path / "old" / "acceptance.png").exists()


def test_plot_summary_adds_lines_over_all_prompts(tmp_path):
    """Two prompts: each keeps its own lines, and "(all)" lines pool every run of the setting
    and variant (mean over runs; speed ratio = ratio of those means)."""
    path = tmp_path / "results.csv"
    rows = [("code", "iterative", 4.0), ("code", "pipeinfer", 6.0),
            ("story", "iterative", 2.0), ("story", "pipeinfer", 5.0)]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["strategy", "speed_tps", "ttft_s", "itl_s", "label"])
        for prompt, strategy, speed in rows:
            writer.writerow([strategy, speed, 0.1, 1 / speed,
                             f"pair=p;prompt={prompt};setting=2n;variant={strategy}"])
    result = launch([PYTHON, PLOT, path, "--out", tmp_path / "fig"], timeout=120)
    assert result.rc == 0, result.describe()
    table = (tmp_path / "fig" / "summary.txt").read_text().splitlines()[1:]
    lines = {(line.split()[1], line.split()[3]): line.split() for line in table}
    assert sorted(lines) == [("(all)", "iterative"), ("(all)", "pipeinfer"),
                             ("code", "iterative"), ("code", "pipeinfer"),
                             ("story", "iterative"), ("story", "pipeinfer")]
    assert [line.split()[1] for line in table][-2:] == ["(all)", "(all)"]  # after the prompts
    assert lines["code", "pipeinfer"][-2] == "1.50"
    assert lines["(all)", "iterative"][4:7] == ["2", "3.00", "±1.41"]
    assert lines["(all)", "pipeinfer"][4:7] == ["2", "5.50", "±0.71"]
    assert lines["(all)", "pipeinfer"][-2] == "1.83"


def test_plot_orders_settings_by_node_count(tmp_path):
    """Rows appended by later runs (8 nodes, then 2, then a second 4-node link) are listed by
    node count; settings with the same count, and names without one, keep first-seen order."""
    path = tmp_path / "results.csv"
    settings = ["4n-none", "8n-none", "2n-slow", "4n-slow", "local", "2n-none", "4n-het"]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["strategy", "speed_tps", "ttft_s", "itl_s", "label"])
        for setting in settings:
            writer.writerow(["iterative", 1.0, 0.1, 1.0,
                             f"pair=p;prompt=code;setting={setting};variant=iterative"])
    result = launch([PYTHON, PLOT, path, "--out", tmp_path / "fig"], timeout=120)
    assert result.rc == 0, result.describe()
    table = (tmp_path / "fig" / "summary.txt").read_text().splitlines()[1:]
    assert [line.split()[2] for line in table] == \
        ["2n-slow", "2n-none", "4n-none", "4n-slow", "4n-het", "8n-none", "local"]


def test_plot_scaling_chart_from_fixed_cpu_per_node(tmp_path):
    """bench_peers --cpu-per-node rows (settings Nn-0.25c): scaling.png, a line per system,
    llama.cpp's speculative decoding at its best draft max per node count."""
    from pipeinfer.report.charts import scaling_series
    from pipeinfer.report.results import read_rows

    path = tmp_path / "scaling.csv"
    rows = [("llama-rpc", n, 1.0 + n / 10) for n in (2, 3, 4)] + \
        [("pipeinfer", n, float(n)) for n in (2, 3, 4)] + \
        [("llama-rpc-spec-d4", n, 2.0) for n in (2, 3, 4)] + \
        [("llama-rpc-spec-d8", n, 2.5 if n == 3 else 1.0) for n in (2, 3, 4)] + \
        [("pipeinfer", 4, 9.0), ("pipeinfer", 8, 1.0)]   # 8 nodes at another CPU: not drawn
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["strategy", "speed_tps", "ttft_s", "itl_s", "label"])
        for variant, nodes, tps in rows:
            cpu = "1c" if nodes == 8 else "0.25c"
            writer.writerow([variant, tps, 0.1, 1 / tps, f"pair=p;prompt=code;setting="
                             f"{nodes}n-{cpu};variant={variant}"])
    cpu, series = scaling_series(read_rows(path))
    assert cpu == "0.25" and series["llama-rpc-spec"] == {2: 2.0, 3: 2.5, 4: 2.0}
    assert series["pipeinfer"] == {2: 2.0, 3: 3.0, 4: 6.5}   # medians of 4 and 9
    result = launch([PYTHON, PLOT, path, "--out", tmp_path / "fig"], timeout=120)
    assert result.rc == 0 and (tmp_path / "fig" / "scaling.png").stat().st_size > 0, \
        result.describe()


def test_plot_missing_csv_is_a_clear_error(tmp_path):
    result = launch([PYTHON, PLOT, tmp_path / "nope.csv", "--out", tmp_path / "fig"])
    assert result.rc == 2
    assert "plot.py: error:" in result.stderr and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "fig").exists()


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("time,strategy,target,draft,ranks,speed_tps,itl_s,ttft_s,accept_rate,label\n",
     "no result rows"),
    ("a,b,c\n1,2,3\n", "not a pipeinfer results CSV"),
])
def test_plot_empty_or_foreign_csv_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "results.csv"
    path.write_text(content)
    result = launch([PYTHON, PLOT, path, "--out", tmp_path / "fig"])
    assert result.rc == 2, result.describe()
    assert message in result.stderr and "Traceback" not in result.stderr


def test_failed_run_is_reported_and_the_rest_still_run(tmp_path, tiny_model, tiny_draft_aligned):
    """A pair whose target does not exist fails; the good pair still runs; exit status 1.
    Also covers a prompt read from a file."""
    (tmp_path / "prompt.txt").write_text("Once upon a time")
    config = tmp_path / "mixed.toml"
    config.write_text(textwrap.dedent(f"""
        n_predict = 4
        timeout = 120
        extra = ["--ignore-eos"]
        strategies = ["iterative"]
        [[pairs]]
        name = "broken"
        target = "{tmp_path / 'missing.gguf'}"
        [[pairs]]
        name = "good"
        target = "{tiny_model}"
        [[prompts]]
        name = "file"
        file = "prompt.txt"
        [[settings]]
        ranks = 2
        """))
    out = tmp_path / "out.csv"
    result = launch([PYTHON, RUNNER, config, "--out", out], timeout=300)
    assert result.rc == 1, result.describe()
    assert "FAILED" in result.stdout and "pair=broken" in result.stdout
    assert "1 run(s) failed" in result.stderr and "pair=broken" in result.stderr
    rows = read_csv(out)
    assert [label(r)["pair"] for r in rows] == ["good"]
    assert rows[0]["n_generated"] == "4"


def test_dry_run_prints_commands_and_runs_nothing(tmp_path):
    out = tmp_path / "never.csv"
    result = launch([PYTHON, RUNNER, CONFIGS / "paper.toml", "--dry-run", "--out", out,
                     "--repeats", "2"])
    assert result.rc == 0, result.describe()
    lines = result.stdout.splitlines()
    commands = [line for line in lines if not line.startswith("#")]
    # 2 repeats x 1 pair x 3 prompts x (3 node counts x 3 links + heterogeneous) x 3 strategies
    assert len(commands) == 2 * 3 * 10 * 3
    assert all("cluster.py" in c for c in commands)  # every paper setting has quotas
    assert any("--nodes 8 --cpu 0.25 --link slow" in c for c in commands)
    assert any("--cpus 0.6,0.6,0.6,0.2 --link gigabit" in c for c in commands)
    assert all("-n 512" in c and "--ignore-eos" in c for c in commands)
    code = [c for c in commands if "prompt=code" in c]
    assert code and all("--chat" in c for c in code)
    assert not any("--chat" in c for c in commands if "prompt=excerpt" in c)
    assert not out.exists()


def test_dry_run_smoke_plain_mpiexec_and_ablation_flags():
    result = launch([PYTHON, RUNNER, CONFIGS / "smoke.toml", "--dry-run",
                     "--set", "target=/m/t.gguf", "--set", "draft=/m/d.gguf"])
    assert result.rc == 0, result.describe()
    commands = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert len(commands) == 10
    assert all("mpiexec -n 2 " in c and "cluster.py" not in c for c in commands)
    assert all("-m /m/t.gguf" in c for c in commands)
    assert sum("--no-cancel" in c for c in commands) == 2
    assert sum("--no-continuous" in c for c in commands) == 2
    ablation = launch([PYTHON, RUNNER, CONFIGS / "ablation.toml", "--dry-run"])
    assert ablation.rc == 0, ablation.describe()
    labels = [line for line in ablation.stdout.splitlines() if line.startswith("#")]
    assert len(labels) == 2 * 3  # two prompts x three variants on 8 nodes
    assert all("setting=8n-gigabit" in line for line in labels)


@pytest.mark.parametrize("body, message", [
    ('strategies = ["turbo"]', "unknown strategy 'turbo'"),
    ('n_predict = 4', "needs at least one [[pairs]]"),
])
def test_bad_config_is_a_clear_error(tmp_path, body, message):
    config = tmp_path / "bad.toml"
    config.write_text(body + '\n[[prompts]]\ntext = "x"\n[[settings]]\nranks = 1\n' +
                      ('[[pairs]]\ntarget = "t"\ndraft = "d"\n' if "pairs" not in message
                       else ""))
    result = launch([PYTHON, RUNNER, config, "--dry-run"])
    assert result.rc == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_missing_model_variable_is_a_clear_error(tmp_path):
    config = tmp_path / "env.toml"
    config.write_text('strategies = ["iterative"]\n'
                      '[[pairs]]\ntarget = "${PIPEINFER_TEST_UNSET_VAR}"\n'
                      '[[prompts]]\ntext = "x"\n[[settings]]\nranks = 1\n')
    result = launch([PYTHON, RUNNER, config, "--dry-run"],
                    env={"PIPEINFER_TEST_UNSET_VAR": ""})
    assert result.rc == 2
    assert "PIPEINFER_TEST_UNSET_VAR" in result.stderr and "--set target=" in result.stderr


# --- experiments/ as a tool: a few entry points with --help, a harness package -------------
EXPERIMENTS = ROOT / "experiments"
ENTRY_POINTS = sorted(p for p in EXPERIMENTS.glob("*.py") if p.name != "__init__.py")


def test_experiments_is_a_few_entry_points_and_no_dated_files():
    """At most about 15 scripts at the top (the harness is a package below them), and no
    file or folder named by a date anywhere under experiments/ (results pages hold those)."""
    assert 0 < len(ENTRY_POINTS) <= 15, [p.name for p in ENTRY_POINTS]
    dated = [str(p) for p in EXPERIMENTS.rglob("*") if re.search(r"20\d\d-\d\d-\d\d", p.name)]
    assert not dated, dated
    assert not (EXPERIMENTS / "reference").exists()


@pytest.mark.parametrize("script", ENTRY_POINTS, ids=lambda p: p.name)
def test_every_entry_point_answers_help(script, tmp_path):
    """`--help` works from any directory (the script puts the repository on its path)."""
    result = launch([PYTHON, script, "--help"], cwd=tmp_path, timeout=120)
    assert result.rc == 0, result.describe()
    assert "usage:" in result.stdout.lower() and "Traceback" not in result.stderr


def test_the_peers_build_answers_help_as_a_module():
    result = launch([PYTHON, "-m", "experiments.harness.build_peers", "--help"], cwd=ROOT)
    assert result.rc == 0, result.describe()
    assert "usage:" in result.stdout


def test_no_test_loads_a_script_through_sys_path():
    """Tests import the benchmarks' harness and scripts as packages (pytest's pythonpath)."""
    offenders = [p.name for p in (ROOT / "tests").rglob("*.py")
                 if re.search(r"sys\.path\.(insert|append)|sys\.path\s*\+?=", p.read_text())]
    assert not offenders, offenders


def test_failover_chart_is_drawn_from_the_token_times(tmp_path):
    """bench_failover.py --replot: the first repeat's tokens per second per client, from the
    streams.csv a run keeps (the kill as client -1), without running anything."""
    streams = tmp_path / "streams.csv"
    lines = ["scenario,repeat,client,t_s", "worker,0,-1,3.000"]
    lines += [f"worker,0,{c},{t / 5:.3f}" for c in range(2) for t in range(15)]   # to 2.8 s
    lines += [f"worker,0,{c},{6 + t / 5:.3f}" for c in range(2) for t in range(10)]  # resumed
    lines += ["worker,1,-1,1.0", "worker,1,0,0.5"]   # a second repeat: not drawn
    streams.write_text("\n".join(lines) + "\n")
    result = launch([PYTHON, EXPERIMENTS / "bench_failover.py", "--replot", streams])
    assert result.rc == 0, result.describe()
    assert (tmp_path / "failover.png").read_bytes().startswith(PNG_SIGNATURE)
    assert f"wrote {tmp_path / 'failover.png'}" in result.stdout


@pytest.mark.parametrize("n_layer, workers, counts", [
    (28, 3, [9, 9, 10]), (28, 7, [4] * 7), (30, 4, [7, 7, 8, 8]), (24, 2, [12, 12]),
    (5, 5, [1] * 5), (30, 7, [4, 4, 4, 4, 4, 5, 5]),
])
def test_an_even_split_gives_the_layers_left_over_to_the_last_workers(n_layer, workers,
                                                                      counts) -> None:
    """The benchmarks' even split, as pipeinfer's own partition applies it: node 0 none, the
    workers within one layer of each other, the larger shares last (the final stage takes
    prompt chunks through its layers fastest)."""
    from experiments.harness.bench_runs import even_split
    from pipeinfer.model.partition import partition
    ranges = partition(n_layer, even_split(n_layer, workers))
    assert [r.n_layer for r in ranges] == [0, *counts]
