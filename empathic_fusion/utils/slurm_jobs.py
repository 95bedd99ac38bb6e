"""The jobs of a sweep on SLURM, every one accounted for (the launcher: hydra_plugins/empathic_fusion_slurm).

Around submitit's submission (`hydra/launcher=submitit_slurm`, `extract_slurm`):
- before submitting, the request is checked against the partition's nodes (utils/slurm_request.py); one that no
  node can meet stops the command with one message per setting, nothing submitted;
- the launcher watches its jobs with `squeue` (no accounting database needed): a job SLURM ends without a
  result (cancelled, killed, out of memory, past its time limit and requeues) is recorded in the sweep's
  `failures/` with SLURM's state and log paths, and the sweep goes on; a job pending on a reason that never
  clears (a request the partition refuses) is cancelled and recorded the same way;
- each job's run folder gets `slurm.json` (job id, node, log paths) and links to its stdout and stderr;
- the sweep's jobs are listed in `<sweep>/jobs.json`; the last job to finish runs the sweep's end-of-sweep
  callbacks (tables, failure list, shard merge), so the results do not depend on the launching process
  staying alive. The launcher runs them again when it ends, with the jobs SLURM ended.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus

from empathic_fusion.utils.multirun import record_failure
from empathic_fusion.utils.slurm_request import read_partition, request_problems

log = logging.getLogger(__name__)

JOBS_FILE = "jobs.json"
FINISHED_DIR = ".finished"
END_LOCK = ".sweep_end.lock"
POLL_SECONDS = 5.0
# squeue reasons of a pending job that clear only when its request or the cluster's configuration changes
NEVER_CLEARS = {"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount",
                "InvalidQOS", "DependencyNeverSatisfied", "QOSMaxGRESPerJob", "QOSMaxCpuPerJobLimit",
                "QOSMaxMemoryPerJob", "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit",
                "AssocMaxCpuPerJobLimit", "AssocMaxNodePerJobLimit", "AssocMaxWallDurationPerJobLimit"}


class SlurmEndedJob(RuntimeError):
    """A sweep job that SLURM ended (or that could never start) without a result."""


def check_request(params: dict[str, Any]) -> None:
    """Stop with one message per setting when no node of the partition can ever run the job."""
    try:
        partition = read_partition(params.get("partition"))
    except LookupError as error:
        sys.stderr.write(f"hydra.launcher.partition={params.get('partition')}: {error}\n")
        raise SystemExit(1) from None
    except (OSError, subprocess.SubprocessError) as error:
        log.warning("could not read the partition from scontrol (%s); submitting unchecked", error)
        return
    if partition is None:
        log.warning("scontrol is not on PATH: the request is submitted unchecked")
        return
    problems = request_problems(params, partition)
    if problems:
        sys.stderr.write("SLURM could never start this sweep's jobs; nothing was submitted:\n"
                         + "\n".join(f"  {p}" for p in problems) + "\n")
        raise SystemExit(1)
    log.info("request: %s task(s) x %s CPU(s), %s GPU(s), %s GB per node on partition %s",
             params.get("tasks_per_node"), params.get("cpus_per_task"), params.get("gpus_per_node") or 0,
             params.get("mem_gb"), partition.name)


def write_jobs(sweep_dir: Path, numbers: list[int], overrides: Sequence[Sequence[str]], jobs: Sequence[Any] = ()) -> None:
    """List jobs in `<sweep>/jobs.json`: number, overrides and, once submitted, SLURM id and logs. A sweeper's
    first batch (job 0) starts the list and forgets which jobs an earlier launch into the folder finished;
    later batches (Optuna's) add to it."""
    listed = {j["job"]: j for j in sweep_jobs(sweep_dir)}
    if numbers and numbers[0] == 0 and not jobs:
        listed = {}
        shutil.rmtree(sweep_dir / FINISHED_DIR, ignore_errors=True)
        (sweep_dir / END_LOCK).unlink(missing_ok=True)
    for i, (number, job_overrides) in enumerate(zip(numbers, overrides)):
        entry: dict[str, Any] = {"job": number, "overrides": list(job_overrides)}
        if jobs:
            entry.update(slurm_job_id=jobs[i].job_id, stdout=str(jobs[i].paths.stdout),
                         stderr=str(jobs[i].paths.stderr))
        listed[number] = entry
    (sweep_dir / JOBS_FILE).write_text(json.dumps([listed[n] for n in sorted(listed)], indent=1))


def sweep_jobs(sweep_dir: Path | str) -> list[dict[str, Any]]:
    """The jobs a SLURM launch listed in the sweep folder (none for other launchers)."""
    path = Path(sweep_dir) / JOBS_FILE
    return json.loads(path.read_text()) if path.is_file() else []


def all_finished(sweep_dir: Path) -> bool:
    """Whether every listed job of the sweep has run to its end (well or with a recorded failure)."""
    jobs = sweep_jobs(sweep_dir)
    return bool(jobs) and all((sweep_dir / FINISHED_DIR / str(j["job"])).exists() for j in jobs)


def end_sweep_once(sweep_dir: Path, config: Any) -> None:
    """Run the sweep's end-of-sweep Hydra callbacks from a job that finished last, one job at a time (a job
    that finds another one at it leaves it: that one sees every finished job's results)."""
    from hydra._internal.callbacks import Callbacks

    lock = sweep_dir / END_LOCK
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    log.info("every listed job of the sweep has finished: writing its end-of-sweep results into %s", sweep_dir)
    try:
        Callbacks(config).on_multirun_end(config=config)
    except SystemExit:  # the summary's exit status is the launching command's, not this job's
        pass
    finally:
        lock.unlink(missing_ok=True)


def link_job_logs(run_dir: Path) -> None:
    """In a job's run folder: `slurm.json` (SLURM ids, node, log paths) and links `slurm.out`/`slurm.err` to
    the job's stdout and stderr in the sweep's hidden `.submitit/` folder."""
    import submitit

    try:
        env = submitit.JobEnvironment()
    except RuntimeError:  # not inside a submitit job
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = env.paths
    (run_dir / "slurm.json").write_text(json.dumps({
        "job_id": env.job_id, "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"), "node": env.hostname,
        "restarts": int(os.environ.get("SLURM_RESTART_COUNT", 0)), "stdout": str(paths.stdout),
        "stderr": str(paths.stderr)}, indent=1))
    for name, target in (("slurm.out", paths.stdout), ("slurm.err", paths.stderr)):
        link = run_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(Path(target).resolve())


def queue_states(job_ids: list[str]) -> dict[str, tuple[str, str]] | None:
    """{job id: (state, reason)} of the jobs still in SLURM's queue; None when squeue cannot be asked now."""
    arrays = sorted({j.split("_")[0] for j in job_ids})
    try:
        done = subprocess.run(["squeue", "-h", "-r", "-j", ",".join(arrays), "-o", "%i|%T|%r"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        return None
    states = {}
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            states[parts[0]] = (parts[1], parts[2])
    return states


def final_state(job_id: str) -> str:
    """How SLURM ended a job: `scontrol show job` while the controller remembers it, else `sacct`."""
    for command in (["scontrol", "show", "job", job_id, "-o"],
                    ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"]):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode != 0 or not done.stdout.strip():
            continue
        if command[0] == "scontrol":
            fields = dict(part.split("=", 1) for part in done.stdout.split() if "=" in part)
            return f"{fields.get('JobState', 'UNKNOWN')} (exit code {fields.get('ExitCode', '?')}, " \
                   f"reason {fields.get('Reason', 'None')})"
        state, _, code = done.stdout.strip().splitlines()[0].partition("|")
        return f"{state} (exit code {code})"
    return "ENDED (no longer in the queue; no record of how: neither scontrol nor sacct knows it)"


def wait_for_jobs(jobs: Sequence[Any], numbers: list[int], overrides: Sequence[Sequence[str]],
                  sweep_dir: Path, poll_seconds: float = POLL_SECONDS) -> list[JobReturn]:
    """Each job's return, in order: its result when it wrote one, else a recorded failure (module docstring)."""
    returns: dict[int, JobReturn] = {}
    gone_once: set[int] = set()
    reported: set[tuple[int, str]] = set()
    while len(returns) < len(jobs):
        states = queue_states([j.job_id for j in jobs])
        for i, job in enumerate(jobs):
            if i in returns:
                continue
            if Path(job.paths.result_pickle).exists():
                returns[i] = _job_result(job, numbers[i], overrides[i], sweep_dir)
                continue
            if states is None:
                continue
            if job.job_id not in states:  # gone from the queue; twice in a row, so a result just written counts
                if i in gone_once:
                    returns[i] = _ended(job, numbers[i], overrides[i], sweep_dir, final_state(job.job_id))
                gone_once.add(i)
                continue
            gone_once.discard(i)
            state, reason = states[job.job_id]
            if state == "PENDING" and reason in NEVER_CLEARS:
                subprocess.run(["scancel", job.job_id], capture_output=True, timeout=60)
                returns[i] = _ended(job, numbers[i], overrides[i], sweep_dir,
                                    f"PENDING ({reason}: it never clears; cancelled)")
            elif state == "PENDING" and reason not in ("None", "Priority", "Resources", "BeginTime", "JobArrayTaskLimit") \
                    and (i, reason) not in reported:
                reported.add((i, reason))
                log.warning("job %s (%s) is pending: %s", numbers[i], job.job_id, reason)
        if len(returns) < len(jobs):
            time.sleep(poll_seconds)
    return [returns[i] for i in range(len(jobs))]


def _job_result(job: Any, number: int, overrides: Sequence[str], sweep_dir: Path) -> JobReturn:
    """The job's own return; a job whose process raised outside the task is recorded as failed."""
    try:
        return job.results()[0]
    except Exception as error:  # submitit's FailedJobError: Hydra or the job's start-up raised
        return _ended(job, number, overrides, sweep_dir, f"FAILED ({type(error).__name__}: {error})")


def _ended(job: Any, number: int, overrides: Sequence[str], sweep_dir: Path, state: str) -> JobReturn:
    """Record a job SLURM ended without a result, and the return a sweeper reads as a failed job."""
    error = SlurmEndedJob(f"SLURM job {job.job_id}: {state}; log {job.paths.stderr}")
    path = record_failure(sweep_dir, number, list(overrides), error, sweep_dir / str(number))
    log.error("job %s (%s) ended without a result: %s; recorded in %s, the sweep goes on", number, job.job_id,
              state, path)
    returned = JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
    returned.return_value = None
    return returned
