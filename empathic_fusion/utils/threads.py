"""How many CPU threads torch may use: the CPUs a SLURM job was given, else the cores this process may run on
that are not busy now.

torch's default (one intra-op thread per physical core) assumes an idle machine. On a machine busy with
other jobs its threads wait for each other at every parallel region and a small model runs many times
slower than on one thread. The default here counts the cores this process may run on
(`os.sched_getaffinity`, capped by a cgroup CPU quota), less those other processes keep busy, measured
from /proc/stat over a fraction of a second. Inside a SLURM job the allocation decides instead: its
`SLURM_CPUS_PER_TASK` (within the process's affinity), since jobs started on one node at the same moment would
each see all of its cores idle. An explicit `threads=N` setting or OMP_NUM_THREADS wins.

numpy's and scipy's BLAS (OpenBLAS: the text experts' eigendecompositions, scikit-learn's solvers) get the same
count, unless OPENBLAS_NUM_THREADS is set: left at one thread per core, a text fold's eigendecomposition on a
machine with one of its two cores busy took 35 s instead of 0.5 s, its threads waiting for each other.
"""
from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


def allowed_cores() -> list[int]:
    """CPU ids this process may run on (its affinity mask; all CPUs where the OS has none)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cgroup_cpu_limit(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """Whole CPUs a cgroup v2 quota allows (`quota period`, rounded up), or None without a quota."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def _cpu_times(cores: list[int]) -> dict[int, tuple[int, int]] | None:
    """(idle, total) jiffies per CPU id from /proc/stat, or None where it cannot be read."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    times = {}
    wanted = {f"cpu{c}" for c in cores}
    for line in lines:
        fields = line.split()
        if fields and fields[0] in wanted:
            values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
            times[int(fields[0][3:])] = (values[3] + values[4], sum(values))
    return times if len(times) == len(cores) else None


def busy_cores(cores: list[int], seconds: float = 0.25) -> float | None:
    """How many of `cores` other processes kept busy over `seconds` (this process sleeps meanwhile)."""
    before = _cpu_times(cores)
    if before is None:
        return None
    time.sleep(seconds)
    after = _cpu_times(cores)
    if after is None:
        return None
    busy = 0.0
    for core in cores:
        idle, total = after[core][0] - before[core][0], after[core][1] - before[core][1]
        busy += 1.0 - idle / total if total > 0 else 0.0
    return busy


def available_cores(seconds: float = 0.25) -> int:
    """Cores this process can use now: its affinity mask, capped by a cgroup quota, less busy cores."""
    cores = allowed_cores()
    limit = min(len(cores), cgroup_cpu_limit() or len(cores))
    busy = busy_cores(cores, seconds)
    if busy is not None:
        limit = min(limit, round(len(cores) - busy))
    return max(1, limit)


# set to the count this module wrote into OPENBLAS_NUM_THREADS, so that a later call (the next job of a sweep in
# the same process) tells its own value from a user's
BLAS_SET_BY = "EMPATHIC_FUSION_BLAS_THREADS"
_measured: dict[str, int] = {}  # available_cores() per sweep, measured at the sweep's first job in this process


def slurm_cpus() -> int | None:
    """The CPUs per task of the SLURM job this process runs in (within its affinity), or None outside one."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if not os.environ.get("SLURM_JOB_ID") or not cpus.isdigit() or int(cpus) < 1:
        return None
    return min(int(cpus), len(allowed_cores()))


def configure_threads(threads: int | None = None, sweep: str | None = None) -> int:
    """Set torch's intra-op threads for this process and return the number: `threads` when given, else
    OMP_NUM_THREADS when set, else a SLURM job's CPUs per task, else available_cores(), measured once per `sweep`
    (a multirun's folder: its later jobs in this process keep the first one's count instead of pausing to measure
    again)."""
    import torch

    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads={threads!r}: must be a positive integer, or null for the available cores")
        count, source = threads, "the threads setting"
    elif os.environ.get("OMP_NUM_THREADS", "").strip().isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        count, source = int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    elif slurm_cpus() is not None:
        count, source = slurm_cpus(), "the SLURM job's SLURM_CPUS_PER_TASK"
    elif sweep is not None and sweep in _measured:
        count, source = _measured[sweep], "cores not busy at this process's first job of the sweep"
    else:
        count, source = available_cores(), f"cores not busy of {len(allowed_cores())} available"
        if sweep is not None:
            _measured.clear()
            _measured[sweep] = count
    torch.set_num_threads(count)
    blas = limit_blas_threads(count)
    log.info("torch uses %d CPU thread(s) (%s)%s", count, source, "" if blas else "; BLAS as OPENBLAS_NUM_THREADS says")
    return count


def limit_blas_threads(count: int) -> bool:
    """Give the BLAS libraries loaded now (threadpoolctl) and those loaded later (OPENBLAS_NUM_THREADS, read when
    a library loads) `count` threads; False, changing nothing, where OPENBLAS_NUM_THREADS is set already."""
    from threadpoolctl import threadpool_limits

    value = os.environ.get("OPENBLAS_NUM_THREADS", "")
    if value and os.environ.get(BLAS_SET_BY) != value:
        return False  # the user's (a value this module wrote, here or in a parent process, is its marker's)
    threadpool_limits(limits=count, user_api="blas")
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ[BLAS_SET_BY] = str(count)
    return True
