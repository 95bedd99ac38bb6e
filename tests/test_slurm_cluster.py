"""Sweeps on a real SLURM cluster: `make slurm-check` starts a one-node cluster from Debian's packages
(scripts/slurm_cluster.sh), runs these tests and stops it. Outside that (no `sinfo`, or no node up) they skip.

Each test submits real jobs through `hydra/launcher=submitit_slurm` with no resource overrides: the request
follows the run (1 CPU for a CPU trainer), so two jobs share a 2-CPU node at once, one thread each."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from empathic_fusion.utils import PROJECT_ROOT

pytestmark = pytest.mark.slurm

# a small corner of the paper's grid: two subsets, two models (one trained, one baseline), one seed
SMALL_GRID = ["experiment=es_story_share", "modality=t,v+t", "model=lf_lstm,mean", "seed=1"]


def _controller_address() -> tuple[str, int] | None:
    """The controller's (host, port) that slurm.conf names, or None where there is no file to read (a
    configless client asks DNS instead)."""
    try:
        text = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).read_text()
    except OSError:
        return None
    host, port = None, 6817  # SlurmctldPort's default
    for line in text.splitlines():
        key, _, value = line.split("#", 1)[0].partition("=")
        key, value = key.strip().lower(), value.strip()
        if key in ("slurmctldhost", "controlmachine") and value and host is None:
            name, _, address = value.partition("(")  # "name" or "name(address)"
            host = address.rstrip(")") or name
        elif key == "slurmctldport" and (digits := re.match(r"\d+", value)):  # "6817" or a range "6817-6818"
            port = int(digits.group())
    return (host, port) if host else None


def _cluster_up() -> bool:
    """Whether a controller answers and a node is up. A client whose configured controller is not listening is
    told so at once by the port; sinfo would retry for about 10 s first, in every test process that collects this file."""
    if shutil.which("sinfo") is None:
        return False
    address = _controller_address()
    if address is not None:
        try:
            socket.create_connection(address, timeout=5).close()
        except OSError:
            return False
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    return done.returncode == 0 and any(s.strip("*") in ("idle", "mixed", "allocated") for s in done.stdout.split())


if not _cluster_up():
    pytest.skip("no SLURM cluster here (make slurm-check starts one)", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def demo_data() -> None:
    """The demo dataset and its features, made once before any job starts (jobs only read them)."""
    done = subprocess.run([sys.executable, "extract.py"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]


def _train(sweep: Path, *overrides: str, wait: bool = True, timeout: float = 900):
    command = [sys.executable, "train.py", "-m", "hydra/launcher=submitit_slurm", *overrides,
               f"hydra.sweep.dir={sweep}"]
    # the jobs get the submitting environment: without make's OMP_NUM_THREADS, as a user submits them
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if not wait:
        return subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env)
    return subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def _queue(sweep_jobs: list[dict]) -> dict[str, str]:
    ids = sorted({j["slurm_job_id"].split("_")[0] for j in sweep_jobs})
    done = subprocess.run(["squeue", "-h", "-r", "-j", ",".join(ids), "-o", "%i %T"], capture_output=True, text=True)
    return dict(line.split() for line in done.stdout.splitlines() if line.strip())


def _submitted(sweep: Path) -> list[dict]:
    jobs = json.loads((sweep / "jobs.json").read_text()) if (sweep / "jobs.json").is_file() else []
    return jobs if jobs and all("slurm_job_id" in j for j in jobs) else []


def test_the_paper_grid_runs_on_slurm_with_no_resource_overrides(tmp_path):
    sweep = tmp_path / "grid"
    done = _train(sweep, "experiment=es_story_share", timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    log = done.stdout + done.stderr
    assert re.search(r"request: 1 task\(s\) x 1 CPU\(s\), 0 GPU\(s\), \d+ GB per node on partition", log), log[-3000:]
    table = (sweep / "paper_table_rating.md").read_text()
    assert "LF-LSTM" in table and "v+a+t" in table and "no results" not in table
    jobs = json.loads((sweep / "jobs.json").read_text())
    assert len(jobs) == 90 and not (sweep / "failures.json").exists()
    for job in jobs:  # each run folder links its SLURM job and logs; each job took its one CPU as one thread
        run = sweep / str(job["job"])
        slurm = json.loads((run / "slurm.json").read_text())
        assert slurm["job_id"] == job["slurm_job_id"] and (run / "slurm.out").resolve() == Path(job["stdout"])
        assert "torch uses 1 CPU thread(s) (the SLURM job's SLURM_CPUS_PER_TASK)" in (run / "train.log").read_text()


def test_a_cancelled_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    sweep = tmp_path / "cancel"
    launcher = _train(sweep, *SMALL_GRID, "trainer.max_epochs=4", wait=False)
    jobs = _wait_for(lambda: _submitted(sweep), 120, "the jobs' submission")
    victim = jobs[0]["slurm_job_id"]
    _wait_for(lambda: _queue(jobs).get(victim) == "RUNNING", 300, f"job {victim} to run")
    subprocess.run(["scancel", victim], check=True)
    output, _ = launcher.communicate(timeout=900)
    assert launcher.returncode == 1, output[-3000:]  # a sweep with a failed job exits non-zero, after its tables
    failure = json.loads((sweep / "failures" / "0.json").read_text())
    assert f"SLURM job {victim}: CANCELLED" in failure["error"] and failure["overrides"] == jobs[0]["overrides"]
    assert json.loads((sweep / "failures.json").read_text())[0]["job"] == 0
    assert all((sweep / str(j["job"]) / "test_metrics.json").is_file() for j in jobs[1:])
    table = (sweep / "paper_table_rating.md").read_text()
    assert "1 job(s) of the sweep have no results" in table and "CANCELLED" in table


def test_tables_come_without_the_launching_process(tmp_path):
    sweep = tmp_path / "orphan"
    launcher = _train(sweep, *SMALL_GRID, wait=False)
    jobs = _wait_for(lambda: _submitted(sweep), 120, "the jobs' submission")
    launcher.send_signal(signal.SIGKILL)  # a lost login session: the jobs run on
    launcher.communicate(timeout=60)
    _wait_for(lambda: not _queue(jobs), 600, "the jobs to end")
    # the job that finished last wrote the sweep's tables
    _wait_for(lambda: (sweep / "paper_table_rating.md").is_file(), 30, "the tables")
    assert "LF-LSTM" in (sweep / "paper_table_rating.md").read_text()
    (sweep / "paper_table_rating.md").unlink()
    done = subprocess.run([sys.executable, "evaluate.py", f"sweep_dir={sweep}", "tables.plots=false"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LF-LSTM" in (sweep / "paper_table_rating.md").read_text()  # any later command writes them too


def test_a_preempted_job_resumes_mid_epoch(tmp_path):
    sweep = tmp_path / "preempt"
    launcher = _train(sweep, "experiment=demo", "seed=1", "trainer.max_epochs=6", "data.batch_size=4", wait=False)
    jobs = _wait_for(lambda: _submitted(sweep), 120, "the job's submission")
    job, stdout = jobs[0]["slurm_job_id"], Path(jobs[0]["stdout"])
    _wait_for(lambda: stdout.is_file() and "epoch 1/6" in stdout.read_text(), 300, "the first epoch's end")
    subprocess.run(["scancel", "--signal=USR2", job], check=True)  # submitit's checkpoint signal, as on preemption
    output, _ = launcher.communicate(timeout=900)
    assert launcher.returncode == 0, output[-3000:]
    log = (sweep / "0" / "train.log").read_text()
    saved = re.search(r"SIGUSR2 at step (\d+) \((\d+) batches into epoch (\d+)\)", log)
    assert saved and int(saved.group(2)) >= 1, log[-3000:]  # the step under way, not the epoch's start
    assert re.search(r"resuming from .*last\.ckpt", log)
    assert json.loads((sweep / "0" / "slurm.json").read_text())["restarts"] == 1  # requeued once, same folder
    assert (sweep / "0" / "test_metrics.json").is_file() and not (sweep / "failures.json").exists()


def test_an_impossible_request_stops_before_submission(tmp_path):
    sweep = tmp_path / "impossible"
    done = _train(sweep, "experiment=demo", "seed=1,2", "trainer=gpu", "hydra.launcher.mem_gb=100000")
    assert done.returncode == 1
    assert "nothing was submitted" in done.stderr and "hydra.launcher.mem_gb=100000" in done.stderr
    assert "hydra.launcher.gpus_per_node=1: no node of partition" in done.stderr
    assert "Traceback" not in done.stderr and not (sweep / ".submitit").exists()


def test_extraction_shards_merge_on_slurm(tmp_path, tiny_dataset):
    store = tmp_path / "store"
    command = [sys.executable, "extract.py", "-m", "hydra/launcher=extract_slurm", "data=empathic_stories",
               f"data.dataset_dir={tiny_dataset}", f"data.store_dir={store}", "modality=v+a+t", "shards=2", "workers=1", "progress=false",
               f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    verify = subprocess.run([sys.executable, "extract.py", "data=empathic_stories", f"data.dataset_dir={tiny_dataset}",
                             f"data.store_dir={store}", "verify=true"], cwd=PROJECT_ROOT, capture_output=True,
                            text=True, timeout=600)
    assert verify.returncode == 0, (verify.stdout + verify.stderr)[-3000:]
