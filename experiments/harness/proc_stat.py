"""What /proc says of a running job's processes, for the scripts that sample a job's CPU from
beside it: the MPI rank a process was launched as, and the CPU seconds of each of its threads."""
import glob
import os

from pipeinfer.job.supervisor import launch_position

TICK = os.sysconf("SC_CLK_TCK")


def rank_of(pid: int | str) -> int | None:
    """The rank the launcher gave process `pid` (None: not a rank, or gone)."""
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        return None
    environ = dict(e.decode(errors="replace").split("=", 1) for e in raw.split(b"\0") if b"=" in e)
    position = launch_position(environ)
    return position[0] if position else None


def thread_cpu(pid: int | str) -> dict[str, tuple[str, float]]:
    """{thread id: (thread name, CPU seconds so far, user and system)} of process `pid`;
    threads that end while being read are left out, as is a process that is gone."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            stat = open(f"{task}/stat").read()
            name = open(f"{task}/comm").read().strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[task.rsplit("/", 1)[1]] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out
