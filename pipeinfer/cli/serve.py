"""`pipeinfer serve`: its options, checked and wired into the job's and the server's
configuration; the server is pipeinfer/front/ (HTTP) and pipeinfer/serve/ (the job's side)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from .. import strategies
from ..config.serving import CACHE_MODES, EXACT, OFF, ServeConfig
from ..job import supervisor
from .commands import Failure, RankedCommand, checked_value, setup_logging, verbosity_options
from .options import (AUTO_SPLIT_HELP, PROFILE_HELP, SPLIT_HELP, model_options,
                      parse_run_split, sampling_options, size_options, speculation,
                      speculation_options, strategy_option)

SERVE = ServeConfig()
DEFAULT_PARALLEL = SERVE.parallel   # as llama-server's automatic slot count
PARALLEL_HELP = ("Requests generated at once, sharing the pipeline (each in a llama.cpp "
                 "context of its own on every rank: N times the KV cache memory, -c tokens "
                 "each, and exact alone or together); more wait in the queue, "
                 "in arrival order. [default: 4; 1 under --strategy pipespec, which "
                 "generates one request at a time]")

BUSY_HELP = ("What a request does while others are generating (--parallel > 1). auto, "
             "under --strategy pipeinfer: every request runs pipeinfer alone and, while "
             "others are under way, verifies its drafts in the run of its own next token "
             "(the requests' own runs then keep the stages busy, so runs of drafts alone "
             "would wait behind them), switching back and forth at run boundaries; under "
             "other strategies auto is same. same: --strategy throughout. speculative, "
             "iterative: a request that starts while others run uses this strategy to its "
             "end; one that starts alone uses --strategy. Exact either way.")
BUSY_CHOICES = ("auto", "same", strategies.SPECULATIVE.name, strategies.ITERATIVE.name)


SERVE_HELP = """Serve the model over HTTP with an OpenAI-compatible API. Two ways:

      pipeinfer serve --ranks 3 -m smollm2 --port 8080        (with failover)

    starts a front process here (no MPI, no llama.cpp in it) that owns the HTTP server and
    every request's state and launches the job of 3 ranks itself (--hostfile/--hosts,
    --mpiexec); when the job ends unexpectedly (a rank killed, a host gone) or hangs
    (nothing from it for --stall-timeout seconds while requests are under way) /health says
    `recovering`, the hosts that no longer answer are left out, the job is started again
    and every request goes on from the last token it sent, with the same tokens as an
    undisturbed run (greedy, or sampled with a seed: the front draws one for a request
    without). With no host left that answers, every request gets a 503 saying so. A
    host that answers again rejoins when the service is idle.

      mpiexec -n 3 pipeinfer serve -m smollm2 --port 8080     (without failover)

    is one MPI job: rank 0 runs the HTTP server (and is the head, as for `run`), ranks
    1..N-1 evaluate their slices of the target's layers; a failed rank ends the server.

    Endpoints (also without /v1): POST /v1/completions and /v1/chat/completions (stream or
    not; chat through the GGUF's own Jinja template, as llama-server --jinja renders it;
    logprobs, logit_bias, repeat/frequency/presence penalties and min_p as llama.cpp's
    sampler chain; tools with tool_choice auto, none, required or a named function, in
    the template's own tool format (Qwen2.5's <tool_call>) or, for templates without tool
    support, llama-server's generic JSON format, calls forced by a grammar;
    response_format json_object / json_schema and GBNF grammars through llama.cpp's
    grammar sampler; fields not supported are a 400 naming them), POST /v1/embeddings
    (the last stage's hidden states, pooled: the model's pooling type or the mean, then
    L2-normalized; float or base64), POST /tokenize and
    /detokenize, GET /v1/models and /v1/models/ID, /health (503 while the model loads) and
    /metrics (Prometheus); a web console at /ui (the cluster, a chat, the pipeline live;
    its data: GET /api/status and /api/events); CORS for browsers (--cors-origin). Greedy
    answers (temperature 0) are exactly single-node llama.cpp's, alone, with other requests
    in flight, and with a prompt prefix reused from a slot (the default --cache-prompt exact).
    Up to --parallel requests are generated at once, their runs interleaved in the
    pipeline; SIGINT or SIGTERM ends the server and every rank.
    """


@click.command(cls=RankedCommand, help=SERVE_HELP,
               context_settings={"show_default": True})
@model_options
@click.option("--alias", default=None,
              help="The model's name in the API (/v1/models, the requests' `model`). "
                   "[default: the -m name without .gguf]", show_default=False)
@size_options
@click.option("--layer-split", "split", default=None, callback=parse_run_split,
              help=SPLIT_HELP + AUTO_SPLIT_HELP)
@click.option("--profile", type=click.Path(dir_okay=False), default=None, help=PROFILE_HELP)
@strategy_option
@speculation_options
@sampling_options(" of requests that give none")
@click.option("--host", default=SERVE.host, help="Address to listen on (0.0.0.0: all).")
@click.option("--port", default=SERVE.port, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port, named in the `listening` line).")
@click.option("--queue", "queue_size", default=SERVE.queue, type=click.IntRange(1, None),
              help="Requests that may wait for the pipeline; the server answers 503 beyond.")
@click.option("--parallel", default=None, type=click.IntRange(1, None), help=PARALLEL_HELP,
              show_default=False)
@click.option("--busy-strategy", default="auto", type=click.Choice(BUSY_CHOICES),
              help=BUSY_HELP)
@click.option("--api-key", default=None, envvar="PIPEINFER_API_KEY",
              help="Require `Authorization: Bearer KEY` on every endpoint but /health "
                   "and the web console's page and files, which hold no data (401 "
                   "otherwise; the console asks for the key once and keeps it in the "
                   "browser). Also from $PIPEINFER_API_KEY.", show_default=False)
@click.option("--cache-prompt", "cache_prompt", default=SERVE.cache_prompt,
              type=click.Choice(CACHE_MODES),
              help="What a request (unless it says `\"cache_prompt\": false`) reuses of "
                   "the prompt prefix a slot keeps from its last request (its KV cells on "
                   "every rank), evaluating only the rest. exact: the prefix cut to the last "
                   "whole prompt chunk (--prefill-chunk) an earlier prompt computed, the "
                   "cells a fresh evaluation gives, so every answer is the one without the "
                   "cache. llama-server: the whole common prefix, as llama-server does, "
                   "answers from a conversation's earlier answers' cells (decode runs): "
                   "faster, but an answer may then differ from a fresh evaluation's. off: "
                   "nothing.")
@click.option("--no-cache-prompt", "cache_prompt", flag_value=OFF, hidden=True)
@click.option("--refill-along/--no-refill-along", "refill_along", default=False,
              help="With --cache-prompt exact: evaluate a conversation's whole prompt chunks "
                   "again as prompt while its answer is generated, chunk by chunk as the "
                   "tokens are accepted, in a context of the slot's own that the slot takes "
                   "back at the end, instead of once the pipeline is idle. A next turn asked "
                   "at once then evaluates only what it adds (an answer's own cells come from "
                   "decode runs, which a fresh evaluation does not compute alike, so they are "
                   "evaluated again either way), answers unchanged. Every rank computes the "
                   "chunks behind the answer's runs, at the lowest priority, in the time they "
                   "leave it; a next turn asked at once waits for what is left of them. Every "
                   "rank has one more llama.cpp context per slot (-c cells of its layers, one "
                   "chunk's compute buffer) and one more thread.")
@click.option("--cors-origin", "cors_origins", multiple=True,
              help="An origin (scheme://host[:port]) whose browser pages may call the API "
                   "(CORS); repeat for several. [default: any origin, *]")
@click.option("--ranks", type=click.IntRange(1, None), default=None,
              help="Start a front process here that launches the job of N ranks itself "
                   "(do not run it under mpiexec then) and keeps the service up: when the "
                   "job ends unexpectedly (a rank killed, a host gone), it is started again on "
                   "the hosts that still answer and every request goes on from the last token "
                   "it sent, with the same tokens (greedy, or sampled with a seed; the front "
                   "draws a seed for a request without one; its prompt is evaluated in the "
                   "batches a fresh evaluation uses, so with --cache-prompt exact or off the "
                   "resumed answer is the undisturbed one). Every rank keeps a copy of its "
                   "KV cells of each request under way on its own disk (in the cache "
                   "directory, removed when the request ends), which the next job's rank "
                   "with the same layers on the same host takes back: a request then "
                   "evaluates only what followed its last copy. A worker also sends its "
                   "neighbours copies of the layers they would take over if its host were "
                   "lost; then the next job keeps every surviving rank's layers, gives them "
                   "the lost ones, and takes the cells back too, unless that split's "
                   "heaviest stage would be over 25% heavier than the balanced one's "
                   "(PIPEINFER_KEEP_CELLS=0: nothing kept). Without --ranks, under "
                   "`mpiexec -n N`, the server is the job itself, without failover.",
              show_default=False)
@click.option("--hostfile", type=click.Path(dir_okay=False), default=None,
              help="With --ranks: the hosts (one `host[:slots]` per line, as mpiexec -f), "
                   "filled in order. [default: this host]", show_default=False)
@click.option("--hosts", "host_list", default=None,
              help="With --ranks: the hosts as a comma list (`a:2,b,c`), instead of "
                   "--hostfile.", show_default=False)
@click.option("--mpiexec", "mpiexec", default=None,
              help="With --ranks: the launcher command (e.g. experiments/cluster.py ... "
                   "--as-mpiexec). [default: the mpiexec beside pipeinfer's Python]",
              show_default=False)
@click.option("--front-address", default=None, metavar="HOST",
              help="With --ranks: the name or IPv4 address of this machine by which the "
                   "job's head reaches the front. The front then listens on TCP on every "
                   "interface, on a free port; both ends prove they hold a random key the "
                   "job gets in its environment before anything is read. [default: a Unix "
                   "socket when every host is this machine, else this machine's name]",
              show_default=False)
@click.option("--max-restarts", default=5, type=click.IntRange(0, None),
              help="With --ranks: give up after the job failed this many times in a row "
                   "(a job that ran for a minute resets the count); back-off 1 to 30 s, "
                   "none after a job that had been up 10 s.")
@click.option("--stall-timeout", default=60.0, type=click.FloatRange(0, None),
              help="With --ranks: a job that sends nothing (no token, no end, no heartbeat) "
                   "for this many seconds while requests (or /metrics, /tokenize calls) are "
                   "under way is taken as hung (a "
                   "rank stopped, a host swapping or cut off without a reset): it is killed "
                   "and started again, its requests resumed as after a crash. Its head beats "
                   "whenever the pipeline returns results, so a slow job (a long prompt on "
                   "slow nodes) is not taken for a hung one as long as each run comes back "
                   "within it; an idle server is never taken for hung. 0: off.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="With --ranks: write the front's record of its jobs here, one JSON line "
                   "each (type \"front\"): job_start (job, ranks, hosts), job_ready (each "
                   "rank's host and pid), job_end (reason, failed_rank), stall, resume "
                   "(request, the tokens each choice had sent), recovered (seconds from the "
                   "failure to the new job taking requests), host_left, host_back, give_up.",
              show_default=False)
@click.option("--channel", default=None, hidden=True)   # the front's address (serve/link.py)
@verbosity_options("-v: progress of every rank, the head's scheduling and tracebacks; -vv: "
                   "also llama.cpp's log.", "Only notices and errors on stderr.")
def serve(model, draft, compact_draft, draft_vocab, alias, n_ctx, n_batch, prefill_chunk,
          prefill_tail, threads, split,
          profile, strategy, temp, top_k, top_p, seed, host, port, queue_size, parallel,
          busy_strategy, api_key, cache_prompt, refill_along, cors_origins, ranks, hostfile,
          host_list, mpiexec, front_address, max_restarts, stall_timeout, trace_path, channel,
          verbose, quiet,
          **speculation_values):
    from ..config.job import JobConfig
    from ..config.run import OutputConfig, RequestConfig
    from ..model.sampling import SamplingParams

    setup_logging(verbose, quiet, rank=supervisor.launcher_rank() or 0)
    _refuse_launch(ranks, hostfile or host_list or mpiexec or trace_path or front_address)
    if split[1]:
        raise Failure("--layer-split: draft models on ranks of their own ('/') run one "
                      "generation per job; serve runs them in the head process", 2)
    parallel = _parallel(parallel, strategy)
    defaults = SamplingParams(temp, top_k, top_p, seed)
    cfg = JobConfig(model, tuple(draft), strategy, split=split[0], profile=profile,
                    threads=threads, n_ctx=n_ctx, n_batch=n_batch, prefill_chunk=prefill_chunk,
                    prefill_tail=prefill_tail, compact_draft=compact_draft,
                    draft_vocab=draft_vocab, full_logits=True, slots=parallel,
                    refill_along=refill_along and cache_prompt == EXACT,
                    busy_strategy=_busy(busy_strategy, strategy, parallel),
                    request=RequestConfig(sampling=defaults), output=OutputConfig(verbose=verbose),
                    **checked_value(speculation, speculation_values, strategy, bool(draft)))
    checked_value(cfg.check)
    served = ServeConfig(alias or _name(model), host, port, queue_size, api_key,
                         tuple(cors_origins) or ("*",), parallel, cache_prompt, defaults, channel)
    if ranks is not None:   # the front: no MPI, no llama.cpp in this process
        from ..front.main import LaunchOptions, main as front_main
        launch = LaunchOptions(ranks, _hosts(hostfile, host_list), mpiexec, max_restarts,
                               tuple(job_args(sys.argv)), stall_timeout, trace_path,
                               front_address)
        sys.exit(front_main(served, launch))
    from ..engine.transport.mpi import world
    from ..serve.service import main as serve_main

    setup_logging(verbose, quiet, rank=world()[0])
    signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))  # SIGTERM ends as Ctrl-C
    sys.exit(serve_main(cfg, served))


def _parallel(given: int | None, strategy: str) -> int:
    """--parallel, or its default for `strategy`."""
    if given is not None:
        return given
    return DEFAULT_PARALLEL if strategies.get(strategy).lanes else 1


def _refuse_launch(ranks: int | None, launch_options) -> None:
    """--ranks (the front launches the job) not under a launcher; its launch options only
    with it."""
    if ranks is not None and supervisor.launcher_rank() is not None:
        raise Failure("--ranks starts the job itself: run `pipeinfer serve --ranks N` "
                      "without mpiexec (or `mpiexec -n N pipeinfer serve` without "
                      "--ranks, which has no failover)", 2)
    if ranks is None and launch_options:
        raise Failure("--hostfile, --hosts, --mpiexec, --front-address and --trace go with "
                      "--ranks (the front launches the job); under mpiexec, give the hosts to "
                      "mpiexec", 2)


def _busy(given: str, strategy: str, parallel: int) -> str | None:
    """--busy-strategy as the strategy name JobConfig takes (None: --strategy's)."""
    if parallel == 1 or given == "same" or given == strategy:
        return None
    if given == "auto":
        return strategies.ADAPTIVE.name if strategy == strategies.PIPEINFER.name else None
    if given == strategies.SPECULATIVE.name and not strategies.get(strategy).speculates:
        raise Failure(f"--busy-strategy speculative needs a draft model, which --strategy "
                      f"{strategy} does not load (use --strategy pipeinfer or speculative "
                      f"with -md)", 2)
    return given


def _name(model: str) -> str:
    name = Path(model).name
    return name[:-5] if name.endswith(".gguf") else name


def _hosts(hostfile: str | None, host_list: str | None):
    """--hostfile's or --hosts' hosts (None: this host)."""
    from ..front.launcher import LaunchError, parse_host, read_hostfile

    if hostfile and host_list:
        raise Failure("give --hostfile or --hosts, not both", 2)
    try:
        hosts = (read_hostfile(hostfile) if hostfile else
                 [parse_host(h) for h in host_list.split(",") if h.strip()] if host_list
                 else None)
    except LaunchError as err:
        raise Failure(str(err), 2) from None
    return tuple(hosts) if hosts else None


# The front's own options, each with a value: the job gets every other option as given.
FRONT_ONLY = ("--ranks", "--hostfile", "--hosts", "--mpiexec", "--max-restarts", "--host",
              "--port", "--api-key", "--cors-origin", "--queue", "--channel", "--stall-timeout",
              "--trace", "--front-address")


def job_args(argv: list[str]) -> list[str]:
    """The options after `serve` in `argv`, less FRONT_ONLY ones (`--opt value` or
    `--opt=value`)."""
    from ..front.launcher import strip_options

    args = argv[argv.index("serve") + 1:] if "serve" in argv else argv[1:]
    return strip_options(args, FRONT_ONLY)
