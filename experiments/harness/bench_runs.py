"""One run of one system for experiments/bench_peers.py: the command lines (llama.cpp's RPC
programs, pipeinfer under experiments/cluster.py), the run, its figures as a dict, and its CSV
row (pipeinfer's results format, so plot.py reads it).

A run's dict has speed_tps, ttft_s, itl_s, prefill_tps, n_prompt, n_generated, accept_rate,
n_drafted, n_accepted, peak_rss_mb (per node, node 0 first) and text, or `error` (one line).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import CLUSTER
from .cluster_run import run_cluster
from .cpu_quota import CpuQuotas, QuotaError
from .peer_output import PeerOutputError, parse_completion, parse_speculative
from .peers import PeerCluster, last_line


@dataclass(frozen=True)
class RunSpec:
    system: str          # llama-rpc, llama-rpc-spec, iterative, speculative, pipeinfer,
    #                      pipeinfer-default-split (pipeinfer without --layer-split)
    variant: str         # the system, or llama-rpc-spec-d<draft max>
    nodes: int
    cpu: float           # cores per node
    model: str
    draft: str
    prompt: str          # already in the chat template
    n: int
    link: str = "none"
    draft_max: int | None = None
    timeout: float = 900
    n_layer: int = 0     # the target's layers, for same_slices
    same_slices: bool = False   # pipeinfer's workers get llama.cpp's layers (llama_ts_layers)
    flags: tuple[str, ...] = ()  # more pipeinfer flags (bench_peers --variant)
    period_us: int | None = None   # the CFS period of the nodes' quotas (None: fitted)

    @property
    def uses_draft(self) -> bool:
        return self.system not in ("llama-rpc", "iterative")

    @property
    def strategy(self) -> str:
        return self.system.removesuffix("-default-split")

    @property
    def split(self) -> list[float]:
        """Node 0 without target layers, the others even (even_split; same_slices: the
        layers llama.cpp gives each rpc-server under -ts 1,1,...)."""
        if self.same_slices:
            return [0.0] + [c / self.n_layer for c in llama_ts_layers(self.n_layer,
                                                                      self.nodes - 1)]
        return even_split(self.n_layer, self.nodes - 1)

    @property
    def setting(self) -> str:
        return f"{self.nodes}n-{self.cpu:g}c" + ("" if self.link == "none" else f"-{self.link}")


def target_layers(model: str) -> int:
    """The number of layers of `model` (a path or cached name)."""
    from pipeinfer.model.gguf_header import read_header
    header = read_header(_model_path(model))
    return int(header.get(f"{header.get('general.architecture')}.block_count"))


def even_split(n_layer: int, workers: int) -> list[float]:
    """A --layer-split giving node 0 no layers and `workers` nodes as many layers each as
    whole layers allow, the ones left over to the last workers (28 over 3: 9, 9, 10; equal
    fractions would give 9, 10, 9). While a prompt goes in, the final stage outputs nothing
    but the prompt's last row, so llama.cpp skips its last layer's feed-forward for every
    other chunk, and it forwards no activations: it takes a 64-token chunk through 10
    layers in the time the others take through 9 (traces of 4 x 0.5 core, Qwen2.5 1.5B).
    Without `n_layer` (0): equal fractions."""
    if not n_layer:
        return [0.0] + [1.0 / workers] * workers
    base, extra = divmod(n_layer, workers)
    return [0.0] + [(base + (w >= workers - extra)) / n_layer for w in range(workers)]


def llama_ts_layers(n_layer: int, devices: int) -> list[int]:
    """The target layers llama.cpp puts on each of `devices` equal devices (-ts 1,1,... -ngl
    99): it places n_layer + 1 layers, the output layer last, layer il on the first device
    whose cumulative share exceeds il / (n_layer + 1). So the last device gets fewer
    transformer layers and the output matrix (Qwen 1.5B on 3: 10, 10, 8 + output)."""
    counts = [0] * devices
    for il in range(n_layer):
        share = il / (n_layer + 1)
        counts[next(d for d in range(devices) if share < (d + 1) / devices)] += 1
    return counts


def _model_path(name: str) -> str:
    from pipeinfer.model.models import resolve_model
    return str(resolve_model(name))


def peer_command(spec: RunSpec, bin_dir: Path, endpoints: str) -> list[str]:
    workers = spec.nodes - 1
    common = ["-m", _model_path(spec.model), "-p", spec.prompt, "-n", str(spec.n),
              "-t", "1", "-tb", "1", "--temp", "0", "--ignore-eos", "-c", "4096",
              "--rpc", endpoints, "-dev", ",".join(f"RPC{i}" for i in range(workers)),
              "-ngl", "99", "-ts", ",".join("1" for _ in range(workers)), "-fit", "off"]
    if spec.system == "llama-rpc":
        return [str(bin_dir / "llama-completion"), *common, "-no-cnv", "--no-display-prompt"]
    return [str(bin_dir / "llama-speculative"), *common, "-md", _model_path(spec.draft),
            "-devd", "none", "-td", "1", "--spec-draft-n-max", str(spec.draft_max),
            "--spec-draft-n-min", "0"]


def run_peer(spec: RunSpec, bin_dir: Path) -> dict:
    """Fresh rpc-servers (so each run's peak memory is its own), the main program on node 0."""
    try:
        quotas = CpuQuotas(uuid.uuid4().hex[:6], [spec.cpu] * spec.nodes, spec.period_us)
        quotas.create()
    except QuotaError as err:
        return {"error": f"no CPU quotas: {err}"}
    links = None
    try:
        if spec.link != "none":
            links = _links(quotas.job, spec)
        with PeerCluster(bin_dir, quotas, links) as cluster:
            run = cluster.run(peer_command(spec, bin_dir, cluster.endpoints()), spec.timeout)
    except RuntimeError as err:
        return {"error": str(err)}
    finally:
        if links is not None:
            links.remove()
        quotas.remove()
    if run.error:
        return {"error": run.error, "peak_rss_mb": run.peak_rss_mb}
    parse = parse_completion if spec.system == "llama-rpc" else parse_speculative
    try:
        result = parse(run.stderr)
    except PeerOutputError as err:
        return {"error": f"{err}; last line: {last_line(run.stderr)}"}
    return {**result, "peak_rss_mb": run.peak_rss_mb, "text": run.stdout}


def _links(job: str, spec: RunSpec):
    from .cluster import LINK_PRESETS, Links
    rate, delay, jitter = LINK_PRESETS[spec.link]
    links = Links(job, spec.nodes, rate, delay, jitter)
    links.create()
    return links


def pipeinfer_command(spec: RunSpec) -> list[str]:
    cmd = [str(Path(sys.executable).parent / "pipeinfer"), "run", "-m", spec.model,
           "-p", spec.prompt, "-n", str(spec.n), "--ignore-eos", "-t", "1", "--json",
           "--strategy", spec.strategy, "-c", "4096"]  # the peers' context (peer_command)
    if spec.system == spec.strategy:
        cmd += ["--layer-split", ",".join(repr(f) for f in spec.split)]
    if spec.uses_draft:
        cmd += ["-md", spec.draft]
    cmd += spec.flags
    period = ["--period-us", str(spec.period_us)] if spec.period_us else []  # (else fitted)
    return [sys.executable, str(CLUSTER), "--nodes", str(spec.nodes),
            "--cpu", f"{spec.cpu:g}", *period, "--link", spec.link, "--", *cmd]


def run_pipeinfer(spec: RunSpec) -> dict:
    code, stdout, stderr = run_cluster(pipeinfer_command(spec), spec.timeout)
    if code is None:
        return {"error": f"hung: stopped after {spec.timeout:.0f} s"}
    if code != 0:
        return {"error": f"exit {code}: {last_line(stderr)}"}
    r = json.loads(stdout.strip().splitlines()[-1])
    keys = ("speed_tps", "ttft_s", "itl_s", "prefill_tps", "n_prompt", "n_generated",
            "accept_rate", "n_drafted", "n_accepted", "text", "split",
            "head_cpu_ms_per_token", "draft_cpu_ms_per_token", "head_loop_cpu_ms_per_token")
    return {**{k: r.get(k) for k in keys},
            "peak_rss_mb": [round(s.get("peak_rss_mb") or 0.0, 1) for s in r["rank_stats"]]}


def write_row(path: str, spec: RunSpec, r: dict) -> None:
    from pipeinfer.report.metrics import CsvRow, append_csv
    label = (f"pair={spec.model}+{spec.draft};prompt=code;setting={spec.setting};"
             f"variant={spec.variant}")
    row = CsvRow(time=time.strftime("%Y-%m-%dT%H:%M:%S"), strategy=spec.system,
                 target=spec.model, draft=spec.draft if spec.uses_draft else "",
                 ranks=spec.nodes,
                 split=r.get("split") or ",".join(f"{f:.3g}" for f in spec.split),
                 threads=",".join("1" for _ in range(spec.nodes)),
                 n_prompt=r.get("n_prompt") or 0, n_generated=r.get("n_generated") or 0,
                 prefill_tps=r.get("prefill_tps"), speed_tps=r.get("speed_tps"),
                 itl_s=r.get("itl_s"), ttft_s=r.get("ttft_s"), accept_rate=r.get("accept_rate"),
                 n_drafted=r.get("n_drafted") or 0, n_accepted=r.get("n_accepted") or 0,
                 label=label, peak_rss_mb=",".join(f"{m:g}" for m in r.get("peak_rss_mb") or []),
                 error=r.get("error") or "")
    append_csv(os.fspath(path), row)
