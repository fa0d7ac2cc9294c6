"""The `pipeinfer` command. Only this module knows about click; library code raises or logs,
and here errors become one-line messages and exit codes, and log records lines on stderr."""

from __future__ import annotations

import signal
import sys

import logging

import click

from ..job import supervisor



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
            # (importing it starts MPI; Ctrl-C meanwhile: see there)
            from ..engine.transport import mpi  # noqa: F401
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
    """The commands, each imported from its module of this package when asked for (so
    `--help` of one loads nothing the others need); they build on the helpers here."""

    MODULES = {"run": "run", "serve": "serve", "split": "models", "models": "models",
               "calibrate": "plan", "plan": "plan", "simulate": "plan"}

    def list_commands(self, ctx):
        return sorted(self.MODULES)

    def get_command(self, ctx, name):
        if name not in self.MODULES:
            return None
        import importlib
        module = importlib.import_module(f".{self.MODULES[name]}", __package__)
        return getattr(module, name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipeinfer")
def commands() -> None:
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
