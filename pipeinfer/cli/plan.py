"""`pipeinfer calibrate`, `pipeinfer plan` and `pipeinfer simulate`: their options and output;
the work is in this package's other modules."""

from __future__ import annotations

import json
import sys

import click

from .. import strategies
from .commands import Failure, RankedCommand, setup_logging, verbosity_options
from .options import JOB, compact_draft_option, draft_vocab_flag, parse_threads, \
    prefill_chunk_option, prefill_tail_option, PREFILL_TAIL_HELP

PROMPT_LEN = 32   # tokens of the prompt modelled by default: a short question


@click.command(cls=RankedCommand, context_settings={"show_default": True})
@click.option("-m", "--model", required=True, help="Target model: a GGUF path or cached name.")
@click.option("-md", "--model-draft", "draft", default=None,
              help="Draft model the head will run (its time per token is measured on rank 0).")
@click.option("-t", "--threads", default="1", callback=parse_threads,
              help="Threads per rank, as `run` will use them: one number, or one per rank.")
@click.option("--profile", type=click.Path(dir_okay=False), default=None,
              help="Also write the profile (JSON) here. It is always kept in the cache for "
                   "these hosts, threads and models, where `run --layer-split auto` finds it.")
@click.option("--repack/--no-repack", default=True,
              help="Time the target's layers repacked (as run's default for iterative, "
                   "speculative and pipeinfer) or in the plain layout (specpipe, pipespec).")
@compact_draft_option
@verbosity_options()
def calibrate(model, draft, threads, profile, repack, compact_draft, verbose, quiet):
    """Measure every rank of the job (launch it like `run`: mpiexec -n N pipeinfer calibrate ...):
    one target layer's and the output layer's time for steps of 1, 2, 3, 4 and 8 tokens at the
    rank's -t, the layer's for a prompt chunk of 128 tokens, the draft model's time per token
    on the head, free memory, and the round trip and bandwidth of the link to the next rank
    (MPI ping-pong of a hidden state). Ranks are timed one at a time. Rank 0 prints a table and
    the profile's path."""
    from ..engine.transport.mpi import Link
    from ..model.models import ModelError
    from ..model.slicing import model_info, read_model
    from ..plan.auto import draft_file, target_file
    from ..plan.calibrate import calibrate as measure, from_rank0, model_id
    from ..plan.profile import cache_path

    link = Link()
    setup_logging(verbose, quiet, rank=link.rank)
    _handshake(link)
    if len(threads) not in (1, link.size):
        raise Failure(f"-t has {len(threads)} values for {link.size} ranks", 2)
    per_rank = [threads[r] if len(threads) > 1 else threads[0] for r in range(link.size)]
    try:
        path = target_file(link, model)
        draft_path = draft_file(link, draft, compact_draft) if draft else None
        info = from_rank0(link, lambda: model_info(read_model(path), path),
                          (ModelError, ValueError, OSError))
        result = measure(link, path, info.n_layer, info.n_embd, per_rank, draft_path, repack,
                         given=model)
    except (ModelError, ValueError, RuntimeError, OSError) as err:
        raise Failure(str(err))
    if result is None:
        return
    cached = cache_path(result.hosts, per_rank, model_id(path, info.n_layer),
                        model_id(draft_path) if draft_path else None)
    for where in filter(None, (profile, cached)):
        result.save(where)
    click.echo(_profile_table(result))
    click.echo(f"profile: {profile or cached}")


def _handshake(link) -> None:
    """The start-up handshake of `run` (runner.abandon_start's other side), so that a rank
    that failed on its command line ends every rank."""
    import os

    from ..engine.transport.mpi import hostname

    _, failure = link.agree((link.rank, hostname(), os.getpid(), None))
    if failure:
        sys.exit(1)


def _profile_table(profile) -> str:
    sizes = sorted(profile.nodes[0].layer_ms)
    head = ("rank host            thr  " + " ".join(f"layer@{b:<3}" for b in sizes)
            + "  output@1  draft  free MB  rtt ms   MB/s")
    rows = [head]
    for n in profile.nodes:
        rows.append(f"{n.rank:<4} {n.host[:15]:15} {n.threads:>3}  "
                    + " ".join(f"{n.layer_ms[b]:9.3f}" for b in sizes)
                    + f"  {n.output_ms[sizes[0]]:8.3f}  {n.draft_ms:5.1f}  {n.free_mb:7.0f}"
                    + f"  {n.link_rtt_ms:6.3f}  {n.link_mb_s:5.0f}")
    return "\n".join(rows)


# --- simulate and plan: one process, no MPI -------------------------------------------------
def _cluster_options(command):
    """The options that describe the cluster and the model, shared by simulate and plan."""
    options = [
        click.option("-m", "--model", required=True,
                     help="Target model: a GGUF path or cached name; a header-only GGUF "
                          "(no weights) is costed per byte from --reference."),
        click.option("-md", "--model-draft", "draft", default=None,
                     help="Draft model on the head (speculative strategies)."),
        click.option("--compact-draft/--no-compact-draft", default=True,
                     help="Time and probe the draft as `run` loads it by default, its compact "
                          "Q4_0 copy (made once and cached), or the file as it is."),
        draft_vocab_flag(
            "Model the draft as `run --draft-vocab` makes it, per strategy: auto is run's "
            "default (the 32768-token copy for pipeinfer on 4 nodes or more with a draft of "
            "65536 tokens or more), K its copy over K tokens, 0 the full vocabulary. A "
            "reduced draft is timed and probed as the head runs it; a profile's draft time is "
            "scaled by what this machine measures for the two files."),
        click.option("--profile", type=click.Path(dir_okay=False), default=None,
                     help="Calibration profile of the nodes (`pipeinfer calibrate`); else "
                          "the nodes are this machine's core scaled by --cpu/--cpus."),
        click.option("--nodes", type=click.IntRange(1, 1024), default=None,
                     help="Number of nodes (with --cpu). [default: 4, or the profile's]"),
        click.option("--cpu", type=click.FloatRange(0, 64, min_open=True), default=None,
                     help="Each node has this share of one of this machine's cores (what a "
                          "cgroup quota gives). [default: 1]"),
        click.option("--cpus", default=None,
                     help="Per-node shares of a core, comma-separated (a heterogeneous "
                          "cluster; node 0 is the head), instead of --nodes/--cpu."),
        click.option("--hostfile", type=click.Path(dir_okay=False), default=None,
                     help="The nodes of an mpiexec hostfile ('host', 'host:N' or 'host slots=N' "
                          "a line; one node per slot, the first the head), each modelled as "
                          "--cpu of this machine's core; the command printed runs on them."),
        click.option("--memory", default=None,
                     help="Free MB per node without a profile, one value for all or one per "
                          "node (comma-separated). [default: not limited]"),
        click.option("--link", default="none",
                     help="Links between nodes: none (loopback), gigabit (1 Gbit/s, 0.2 ms "
                          "each way), slow (100 Mbit/s, 1 ms), or LAT,BW (one-way ms, "
                          "Mbit/s)."),
        click.option("--reference", default=None,
                     help="A model with weights whose measured cost per byte scales a "
                          "header-only -m. [default: qwen-coder-1.5b]"),
        click.option("--accept-rate", type=click.FloatRange(0, 1), default=None,
                     help="Share of draft tokens that match the target. [default: a probe of "
                          "the draft against the target, 64 tokens of a coding prompt]"),
        click.option("-n", "--n-predict", default=64, type=click.IntRange(2, None),
                     help="Tokens to generate."),
    ]
    command = _prompt_options(command)   # listed after these
    for option in reversed(options):
        command = option(command)
    return command


def _prompt_options(command):
    """The prompt whose TTFT simulate and plan predict."""
    command = prefill_tail_option(PREFILL_TAIL_HELP)(command)
    command = prefill_chunk_option(
        "The prompt's batches end at multiples of this many tokens, as `run --prefill-chunk` "
        "evaluates it: all in flight at once, so the stages work on different batches at the "
        "same time.")(command)
    return click.option("--prompt-len", default=PROMPT_LEN, type=click.IntRange(1, None),
                        help="Tokens of the prompt: TTFT is its evaluation through the "
                             "pipeline and the first token.")(command)


def _setup(o: dict):
    """The costed cluster (plan/inputs.py) of the cluster options' values `o`, checked."""
    from ..plan.hosts import parse_memory, read_hostfile
    from ..plan.inputs import ClusterSpec, cluster

    profile, nodes, hostfile = o["profile"], o["nodes"], o["hostfile"]
    if o["cpus"] is not None and (nodes is not None or o["cpu"] is not None):
        raise Failure("give either --cpus or --nodes/--cpu", 2)
    if profile is not None and (hostfile or o["memory"]):
        raise Failure("a profile names its hosts and their memory: give --profile, or "
                      "--hostfile/--memory", 2)
    hosts = read_hostfile(hostfile) if hostfile else None
    if hosts and nodes is not None and nodes != len(hosts):
        raise Failure(f"--nodes {nodes} but hostfile {hostfile} has {len(hosts)} slots", 2)
    shares = _shares(o, hosts)
    mem = parse_memory(o["memory"], len(shares)) if o["memory"] and shares else None
    spec = ClusterSpec(o["model"], o["draft"], profile, nodes if profile else None,
                       tuple(shares) if shares else None, o["link"], o["reference"],
                       tuple(hosts) if hosts else None, tuple(mem) if mem else None,
                       o["compact_draft"])
    return cluster(spec)


def _shares(o: dict, hosts) -> list[float] | None:
    """Each modelled node's share of a core: --cpus, or --nodes (or the hostfile's) x --cpu;
    None with a profile."""
    if o["cpus"] is None:
        return None if o["profile"] is not None else \
            [o["cpu"] or 1.0] * (len(hosts) if hosts else o["nodes"] or 4)
    try:
        shares = [float(v) for v in o["cpus"].split(",")]
    except ValueError:
        raise Failure(f"--cpus {o['cpus']!r} is not a comma-separated list of numbers", 2)
    if hosts and len(shares) != len(hosts):
        raise Failure(f"--cpus has {len(shares)} shares for the hostfile's {len(hosts)} "
                      "slots", 2)
    return shares


def _accept(setup, strategy: str, given: float | None) -> float:
    from ..plan.acceptance import accept_rate
    from ..plan.modelled import has_weights

    if given is not None or not strategies.get(strategy).speculates:
        return 1.0 if given is None else given
    if setup.draft is None:
        raise Failure(f"strategy {strategy} needs a draft model (-md)", 2)
    if not has_weights(setup.model):
        raise Failure(f"{setup.model.name} has no weights, so the draft cannot be probed "
                      "against it: give --accept-rate", 2)
    return accept_rate(setup.model, setup.draft, embeddings=setup.embeddings)


def _plan_errors():
    from ..plan.cost import CostError
    from ..plan.profile import ProfileError

    return CostError, ProfileError, OSError


@click.command(context_settings={"show_default": True})
@_cluster_options
@click.option("--strategy", default=strategies.PIPEINFER.name,
              type=click.Choice(strategies.names(simulated=True)),
              help="The schedule to simulate (the scheduler classes `run` uses).")
@click.option("--layer-split", "split", default=None,
              help="Fractions per node, or auto (the solver's split). [default: as `run`: "
                   "stages of equal weight, the head without layers when it drafts]")
@click.option("--seed", default=0, type=int, help="Seed of the draft's right and wrong guesses.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@verbosity_options()
def simulate(strategy, split, seed, as_json, verbose, quiet, **cluster_values):
    """Predict a run's speed and its TTFT (time to the first token of a --prompt-len prompt)
    without running it: the scheduler core `run` uses, driven by a discrete-event clock with
    modelled stage costs (from --profile, or this machine's measured layer times scaled by
    each node's --cpu share; a header-only GGUF scaled per byte), link latency and bandwidth,
    the draft's time per token and its acceptance. One process, no MPI; beyond a one-time
    measurement on this machine and the acceptance probe it decodes nothing."""
    from ..plan.inputs import counts_for, for_strategy
    from ..plan.simulate import simulate as run_sim

    setup_logging(verbose, quiet)
    o = cluster_values
    accept_rate = o["accept_rate"]
    if strategies.get(strategy).speculates and o["draft"] is None:
        raise Failure(f"strategy {strategy} needs a draft model (-md)", 2)
    try:
        setup = for_strategy(_setup(o), strategy, o["draft_vocab"])
        counts = counts_for(setup, strategy, split)
        rate = _accept(setup, strategy, accept_rate)
        result = run_sim(setup.pipeline(), counts, _sim_config(o, strategy, rate, seed))
    except _plan_errors() as err:
        raise Failure(str(err))
    out = {"strategy": strategy, "nodes": len(counts), "layers": counts,
           "draft_vocab": setup.draft_vocab, "draft_ms": round(setup.nodes[0].draft_ms, 4),
           "assumed_accept_rate": round(rate, 4), "prefill_chunk": o["prefill_chunk"],
           "prefill_tail": o["prefill_tail"], **result.to_dict()}
    if as_json:
        click.echo(json.dumps(out))
    else:
        click.echo(f"{strategy} on {len(counts)} nodes, layers {counts}: "
                   f"{result.speed_tps:.2f} t/s, TTFT {1e3 * result.ttft_s:.0f} ms for a "
                   f"{result.prompt_len}-token prompt ({result.prefill_tps:.0f} t/s prefill), "
                   f"ITL {1e3 * result.itl_s:.0f} ms (draft acceptance {rate:.2f}"
                   + (f", {setup.draft_vocab}-token draft vocabulary)" if setup.draft_vocab
                      else ")"))


def _sim_config(o: dict, strategy: str, rate: float, seed: int = 0):
    """The simulated generation of the cluster options' values `o`."""
    from ..plan.simulate import SimConfig

    return SimConfig(strategy, o["n_predict"], o["prompt_len"], accept_rate=rate, seed=seed,
                     prefill_chunk=o["prefill_chunk"], prefill_tail=o["prefill_tail"])


@click.command(context_settings={"show_default": True})
@_cluster_options
@click.option("--strategy", "chosen_strategies",
              default=",".join(strategies.names(simulated=True)),
              help="Strategies to plan, comma-separated (the speculative ones need -md).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per strategy.")
@verbosity_options()
def plan(chosen_strategies, as_json, verbose, quiet, **cluster_values):
    """Plan a job: per strategy, the split that minimises its bound within each node's memory
    (nodes that would only slow the pipeline are left out), the predicted speed, TTFT (time
    to the first token of a --prompt-len prompt), prefill speed and ITL (the simulator on
    that split), and the exact mpiexec command line that runs it. Nodes from --profile (the
    hosts named in the command), or modelled by --cpu/--cpus (named by --hostfile, limited by
    --memory)."""
    from ..plan.advice import advise, table
    from ..plan.inputs import for_strategy

    setup_logging(verbose, quiet)
    o = cluster_values
    n_predict, accept_rate = o["n_predict"], o["accept_rate"]
    chosen = [s for s in chosen_strategies.split(",") if s]
    known = strategies.names(simulated=True)
    unknown = [s for s in chosen if s not in known]
    if unknown or not chosen:
        raise Failure(f"--strategy: plan knows {', '.join(known)}, not "
                      f"{','.join(unknown) or 'nothing'}", 2)
    if o["draft"] is None:
        chosen = [s for s in chosen if not strategies.get(s).speculates] or chosen
    args = ["-n", str(n_predict)]
    if o["prefill_chunk"] != JOB.prefill_chunk:
        args += ["--prefill-chunk", str(o["prefill_chunk"])]
    if o["prefill_tail"] != JOB.prefill_tail:
        args += ["--prefill-tail", str(o["prefill_tail"])]
    try:
        common = _setup(o)
        setups = {s: for_strategy(common, s, o["draft_vocab"]) for s in chosen}
        rates = {s: _accept(setups[s], s, accept_rate) for s in chosen}
        advice = [advise(setups[s], _sim_config(o, s, rates[s]), args) for s in chosen]
    except _plan_errors() as err:
        raise Failure(str(err))
    if as_json:
        for a in advice:
            click.echo(json.dumps({**a.to_dict(), "assumed_accept_rate": rates[a.strategy]}))
    else:
        click.echo(table(advice, common))
