"""The `pipeinfer` command line: the only package that imports click. Library code raises
or logs; here errors become one-line messages and exit codes.

commands.py (the command group, logging, errors, the ranked start) -> run.py (`run`, then
runner.py on every rank) | serve.py (`serve`: the front, or rank 0 of an MPI job) | plan.py
(`calibrate`, `plan`, `simulate`) | models.py (`models`, `split`); options.py holds the
option groups and help texts they share."""


def main() -> None:
    """The console script. First of all, before MPI starts: a rank of a job under a launcher
    forks a supervisor (the child goes on as the rank; the parent names it if a signal kills
    it), and takes Ctrl-C from then on (job/supervisor.py)."""
    import signal

    from ..job import supervisor

    supervisor.supervise()
    if supervisor.launcher_rank() is not None:
        signal.signal(signal.SIGINT, supervisor.quit_at_once)
    from .commands import commands

    commands()
