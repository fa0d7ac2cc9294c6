"""A supervisor process per MPI rank, so that a rank killed by a signal is named.

When one rank of a job dies from a signal (SIGKILL from the OOM killer, a crash), MPICH's
hydra SIGKILLs every other rank within milliseconds: no pipeinfer process is left to say
which rank died, and hydra's own report names the first process it reaped, by pid, which can
be a rank it killed itself. So `pipeinfer run` under an MPI launcher with more than one rank
forks as the very first thing it does, before MPI starts:

- the child is the rank: it goes on with the command (MPI, the model, the `ready:` line with
  its own pid) in a process group of its own, and gets SIGKILL (PR_SET_PDEATHSIG) if the
  supervisor dies, e.g. when the launcher kills the job: the launcher only knows the
  supervisor (the head of `serve` gets JOB_LOST instead, answers its clients, then ends);
- the parent, the supervisor, only waits for the child (no CPU, no MPI, it never touches the
  PMI socket it inherited) and passes on the signals it gets (SIGINT, SIGTERM, SIGHUP, ...):
  the child gets each exactly once, whether the launcher or a terminal signalled one process
  or a whole process group. When the child ends, the supervisor ends the same way: with its
  exit status, or by the signal passed on to it. Killed by any other signal, the supervisor
  prints one line naming the rank, such as

      pipeinfer: error: rank 2 (node3, pid 4242) was killed by signal 9 (SIGKILL;
      out of memory?); ending the job

  (on one line) and dies by the same signal (SIGKILL instead of one that dumps core); the
  launcher then ends the job, as it did when the rank itself died.
  (Hydra's "BAD TERMINATION ... PID <pid>" block names the first process it reaped: now a
  supervisor, whose pid is the parent of a pid in the head's `ready:` line.)

Only on Linux, and only for `pipeinfer run` and `serve` when a launcher's environment says this is one of
several ranks (PMI_RANK/PMI_SIZE of MPICH's hydra and Intel MPI, OMPI_COMM_WORLD_RANK/SIZE of
Open MPI, PMIX_RANK, SLURM_PROCID/SLURM_NTASKS). PIPEINFER_NO_SUPERVISOR=1 turns it off: the
rank then runs in the launched process itself, as without a launcher. (A launcher that
signals every process of a job step one by one, such as Slurm's proctrack/cgroup, makes a
rank get such a signal twice: from the launcher and from its supervisor.)

The rank itself handles Ctrl-C here too (quit_at_once while it imports, then interrupt):
under a launcher, mpiexec forwards SIGINT to every rank; each must end soon, with one notice
(from rank 0) and status 130, and no traceback.

This module is imported before anything heavy: it may use only the standard library, and
must not import mpi4py (whose import starts MPI) or anything that writes to stdout.
"""

from __future__ import annotations

import os
import signal
import sys

DISABLE_VAR = "PIPEINFER_NO_SUPERVISOR"

# (rank, size) variables of the launchers, in order of preference; PMIx sets no size.
LAUNCHER_VARS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMIX_RANK", None), ("SLURM_PROCID", "SLURM_NTASKS"))

# Passed on to the rank. SIGTSTP and SIGCONT too, as the rank is in a process group of its own.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGTSTP, signal.SIGCONT)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# What the head of `pipeinfer serve` gets instead of SIGKILL when its supervisor dies (the
# launcher ends the job after another rank died): it answers the requests under way with 503
# before it ends (serve/service.py), so clients learn why instead of losing the connection.
JOB_LOST = signal.SIGUSR2

# Signals whose default action ends a process without a core dump.
TERMINATING = frozenset(getattr(signal, name) for name in (
    "SIGHUP", "SIGINT", "SIGKILL", "SIGPIPE", "SIGALRM", "SIGTERM", "SIGUSR1", "SIGUSR2",
    "SIGVTALRM", "SIGPROF", "SIGIO", "SIGPWR", "SIGSTKFLT") if hasattr(signal, name))


def launch_position(environ=os.environ) -> tuple[int, int | None] | None:
    """(rank, size) as the MPI launcher set them (size None if unknown); None without one."""
    for rank_var, size_var in LAUNCHER_VARS:
        rank = environ.get(rank_var, "")
        if rank.isdigit():
            size = environ.get(size_var, "") if size_var else ""
            return int(rank), (int(size) if size.isdigit() else None)
    return None


def wanted(argv=None, environ=os.environ) -> bool:
    """Whether this process should fork a supervised rank: `pipeinfer run` or `serve` on
    Linux, one of several ranks of a launcher, not turned off."""
    argv = sys.argv if argv is None else argv
    if not sys.platform.startswith("linux") or argv[1:2] not in (["run"], ["serve"]):
        return False
    if environ.get(DISABLE_VAR, "").strip().lower() not in ("", "0", "no", "false"):
        return False
    position = launch_position(environ)
    return position is not None and (position[1] is None or position[1] > 1)


def supervise() -> None:
    """If wanted(): fork. Returns in the child, which is the rank; the parent supervises it
    and never returns. Returns at once (unsupervised) if not wanted or if forking fails."""
    if not wanted():
        return
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return  # without the death signal a rank would outlive a killed supervisor
    rank = launch_position()[0]
    parent = os.getpid()
    # Held back until the child has a process group of its own: a signal sent to the group
    # before that would reach the child twice (directly, and passed on).
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        child = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return
    if child == 0:
        # (a head that a front launched, `--channel`, has no clients of its own to answer:
        # SIGKILL, which ends it even inside a blocking MPI call, where a Python handler
        # would wait for the call to return, and with it the launcher, for its output)
        serving_head = sys.argv[1:2] == ["serve"] and rank == 0 and \
            not any(a == "--channel" or a.startswith("--channel=") for a in sys.argv)
        _become_rank(prctl, parent, JOB_LOST if serving_head else signal.SIGKILL)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return
    _supervise(child, rank, old_mask)


def _become_rank(prctl, parent: int, death_signal: int) -> None:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    prctl(PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor was killed before prctl: too late for it
        os.kill(os.getpid(), signal.SIGKILL)


def _supervise(child: int, rank: int, old_mask) -> None:
    """The supervisor's whole life: never returns, and leaves all output to the child."""
    try:
        os.setpgid(child, child)  # also here: whichever of the two runs first
    except OSError:
        pass
    passed_on: set[int] = set()
    reaped = False

    def pass_on(signum, frame) -> None:
        if reaped:  # its pid may be another process's by now
            return
        passed_on.add(signum)
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    # Whatever the inherited disposition: a job started from a background job of a
    # non-interactive shell (`nohup ... &`) inherits SIGINT ignored, and Ctrl-C must still
    # reach the rank (which installs its own handler in cli/commands.py).
    for signum in FORWARDED:
        signal.signal(signum, pass_on)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    while True:
        try:
            _, status = os.waitpid(child, 0)  # interrupted by a signal: pass_on, then again
            reaped = True
            break
        except ChildProcessError:
            os._exit(1)
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    signum = os.WTERMSIG(status)
    if signum not in passed_on:  # not a signal for the whole job: this rank alone was killed
        _report(rank, child, signum, os.WCOREDUMP(status))
    _die_by(signum)


def _die_by(signum: int) -> None:
    """End by signal `signum` (SIGKILL instead of one that would dump the supervisor's core).
    Not an exit status of 128 + signum: hydra ends the whole job at once when a process it
    started dies by a signal, but not always when it exits, if it reaps it before it sees its
    PMI socket close."""
    sig = signum if signum in TERMINATING else signal.SIGKILL
    try:
        if sig != signal.SIGKILL:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    finally:
        os._exit(128 + signum)


def killed_message(rank: int, host: str, pid: int, signum: int, core: bool = False) -> str:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    note = "; out of memory?" if signum == signal.SIGKILL else ", core dumped" if core else ""
    return (f"pipeinfer: error: rank {rank} ({host}, pid {pid}) was killed by signal {signum} "
            f"({name}{note}); ending the job")


def _report(rank: int, child: int, signum: int, core: bool) -> None:
    # Not through logging: the supervisor forked before the command line was read, so it has
    # no set-up of its own, and one unbuffered write is all it ever prints.
    # Streamed text may end mid-line on a terminal, hence the newline first (as runner does).
    line = "\n" + killed_message(rank, os.uname().nodename, child, signum, core) + "\n"
    try:
        os.write(2, line.encode())
    except OSError:
        pass


# --- Ctrl-C in the rank -------------------------------------------------------------------

INTERRUPT_RETRY_S, INTERRUPT_GRACE_S = 2, 5  # seconds


def launcher_rank() -> int | None:
    """This process's rank as its MPI launcher set it; None when not started by a launcher."""
    position = launch_position()
    return None if position is None else position[0]


def interrupted_notice() -> None:
    """The one `pipeinfer: interrupted` of a job (rank 0's), on a line of its own: streamed
    text may have left one unfinished. Logged: the CLI has set logging up by then."""
    if not launcher_rank():
        import logging  # loaded by then; not at the top, to keep imports before quit_at_once few

        logging.getLogger(__name__).warning("interrupted", extra={"fresh_line": True})


def quit_at_once(signum, frame) -> None:
    """SIGINT while still importing (a good part of a second; MPI is not started): a
    KeyboardInterrupt there gives a traceback per rank, or is lost in an import callback.
    The notice is written directly: logging may not even be imported yet."""
    if not launcher_rank():
        try:
            os.write(2, b"\npipeinfer: interrupted\n")
        except OSError:  # no stderr left to tell
            pass
    os._exit(130)


def interrupt(signum, frame) -> None:
    """SIGINT once MPI runs: KeyboardInterrupt, which runner.main and the CLI turn into an
    orderly exit. Python swallows it when it lands in a callback from C (llama.cpp's log
    callback while a model loads), so it is raised again INTERRUPT_RETRY_S later; if the
    process still runs INTERRUPT_GRACE_S after that (waiting on a rank that is gone),
    SIGALRM's default action ends it."""
    sys.unraisablehook = _quiet_interrupts
    signal.signal(signal.SIGALRM, _interrupt_again)
    signal.alarm(INTERRUPT_RETRY_S)
    raise KeyboardInterrupt


def _interrupt_again(signum, frame) -> None:
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(INTERRUPT_GRACE_S)
    raise KeyboardInterrupt


def _quiet_interrupts(unraisable) -> None:
    """A swallowed KeyboardInterrupt is raised again: no "Exception ignored" report for it."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)
