"""The SLURM launcher's logic without a cluster: the request from the run's settings, the check against a
partition, and how jobs SLURM ended are accounted for (tests/test_slurm_cluster.py runs it on a real one)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from empathic_fusion.utils import CONFIG_DIR
from empathic_fusion.utils import slurm_jobs
from empathic_fusion.utils.multirun import collect_failures
from empathic_fusion.utils.slurm_request import (Node, Partition, _minutes, gpu_count, request_problems,
                                                 slurm_extract_mem_gb, slurm_mem_gb)


@pytest.mark.parametrize("overrides,gpus,tasks,cpus", [
    ([], 0, 1, 1),                                   # the default trainer: CPU request, one thread
    (["trainer=cpu"], 0, 1, 1),
    (["trainer=gpu"], 1, 1, 2),
    (["trainer=ddp", "trainer.devices=4"], 4, 4, 2),  # one task per GPU: Lightning takes the ranks from SLURM
    (["trainer=ddp_cpu"], 0, 2, 1),
    (["threads=3", "data.num_workers=2"], 0, 1, 5),  # threads plus one CPU per loader worker
])
def test_the_request_follows_the_trainer(overrides, gpus, tasks, cpus, tmp_path):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=submitit_slurm", f"data.store_dir={tmp_path}", *overrides],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.cpus_per_task) == (gpus, tasks, cpus)
    assert launcher.mem_gb == 4 * tasks  # an empty store: the base per task


def test_memory_grows_with_the_store(tmp_path):
    (tmp_path / "arrays").mkdir()
    (tmp_path / "arrays" / "a.npy").write_bytes(b"\0" * 1_500_000)
    assert slurm_mem_gb(str(tmp_path)) == 4 + 1  # twice 1.5 MB, rounded up to a GB
    assert slurm_mem_gb(str(tmp_path / "missing"), tasks=2) == 8
    assert slurm_extract_mem_gb(3) == 10


def test_slurm_formats():
    assert _minutes("UNLIMITED") == math.inf and _minutes("30") == 30 and _minutes("2:00:00") == 120
    assert _minutes("1-00:00:00") == 1440 and _minutes("05:30") == 5.5
    assert gpu_count("gpu:h100:4(S:0-1)") == 4 and gpu_count("gpu:2,shard:8") == 2 and gpu_count("(null)") == 0


CPU_PARTITION = Partition("debug", "UP", 60.0, math.inf, (Node("vm", 2, 20000, 0),))
FITS = {"tasks_per_node": 1, "cpus_per_task": 1, "gpus_per_node": 0, "mem_gb": 4, "timeout_min": 30,
        "signal_delay_s": 120, "nodes": 1}


def test_a_request_that_fits_has_no_problem():
    assert request_problems(FITS, CPU_PARTITION) == []


@pytest.mark.parametrize("change,named", [
    ({"gpus_per_node": 1}, "hydra.launcher.gpus_per_node=1: no node of partition debug has a GPU"),
    ({"cpus_per_task": 8}, "hydra.launcher.cpus_per_task=8 x tasks_per_node=1 = 8 CPUs: the largest node"),
    ({"mem_gb": 64}, "hydra.launcher.mem_gb=64 (65536 MB): the largest node of partition debug has 20000 MB"),
    ({"timeout_min": 240}, "hydra.launcher.timeout_min=240 is above partition debug's MaxTime of 60 min"),
    ({"timeout_min": 1}, "hydra.launcher.signal_delay_s=120 is not below hydra.launcher.timeout_min=1"),
    ({"nodes": 2}, "hydra.launcher.nodes=2: partition debug has 1 node(s)"),
])
def test_a_request_no_node_can_meet_names_its_setting(change, named):
    problems = request_problems({**FITS, **change}, CPU_PARTITION)
    assert len(problems) == 1 and problems[0].startswith(named), problems


def test_no_single_node_with_everything_at_once():
    partition = Partition("mixed", "UP", math.inf, math.inf, (Node("big", 32, 8000, 0), Node("gpu", 2, 8000, 1)))
    problems = request_problems({**FITS, "cpus_per_task": 8, "gpus_per_node": 1}, partition)
    assert len(problems) == 1 and "no node of partition mixed has 8 CPUs, 1 GPU(s)" in problems[0]
    assert "is DOWN" in request_problems(FITS, Partition("x", "DOWN", math.inf, math.inf, CPU_PARTITION.nodes))[0]


class FakeJob:
    def __init__(self, folder: Path, job_id: str, result: bool):
        self.job_id = job_id
        self.paths = SimpleNamespace(result_pickle=folder / f"{job_id}_result.pkl", stderr=folder / f"{job_id}.err",
                                     stdout=folder / f"{job_id}.out")
        if result:
            self.paths.result_pickle.write_text("done")

    def results(self):
        return ["returned " + self.job_id]


def test_jobs_slurm_ended_are_recorded_and_the_others_returned(tmp_path, monkeypatch):
    jobs = [FakeJob(tmp_path, "7_0", True), FakeJob(tmp_path, "7_1", False), FakeJob(tmp_path, "7_2", False)]
    cancelled = []
    monkeypatch.setattr(slurm_jobs, "queue_states", lambda ids: {"7_2": ("PENDING", "PartitionConfig")})
    monkeypatch.setattr(slurm_jobs, "final_state", lambda job_id: "CANCELLED (exit code 0:15, reason None)")
    monkeypatch.setattr(slurm_jobs.subprocess, "run", lambda command, **kw: cancelled.append(command))
    overrides = [["seed=1"], ["seed=2"], ["seed=3"]]
    returns = slurm_jobs.wait_for_jobs(jobs, [0, 1, 2], overrides, tmp_path, poll_seconds=0)
    assert returns[0] == "returned 7_0"
    assert [r.return_value for r in returns[1:]] == [None, None]  # what a sweeper reads as a failed job
    assert cancelled == [["scancel", "7_2"]]  # pending for ever: cancelled, not waited on
    failures = {f["job"]: f for f in collect_failures(tmp_path)}
    assert "SLURM job 7_1: CANCELLED" in failures[1]["error"] and "7_1.err" in failures[1]["error"]
    assert "PartitionConfig: it never clears" in failures[2]["error"] and failures[2]["overrides"] == ["seed=3"]


def test_the_last_job_to_finish_ends_the_sweep_once(tmp_path, monkeypatch):
    slurm_jobs.write_jobs(tmp_path, [0, 1], [["seed=1"], ["seed=2"]])
    assert [j["job"] for j in json.loads((tmp_path / "jobs.json").read_text())] == [0, 1]
    (tmp_path / slurm_jobs.FINISHED_DIR).mkdir()
    (tmp_path / slurm_jobs.FINISHED_DIR / "0").touch()
    assert not slurm_jobs.all_finished(tmp_path)
    (tmp_path / slurm_jobs.FINISHED_DIR / "1").touch()
    assert slurm_jobs.all_finished(tmp_path)
    ended = []

    class Callbacks:
        def __init__(self, config):
            pass

        def on_multirun_end(self, config):
            ended.append(config)
            raise SystemExit(1)  # the sweep summary's exit status belongs to the launching command

    monkeypatch.setattr("hydra._internal.callbacks.Callbacks", Callbacks)
    slurm_jobs.end_sweep_once(tmp_path, "cfg")
    assert ended == ["cfg"] and not (tmp_path / slurm_jobs.END_LOCK).exists()
    (tmp_path / slurm_jobs.END_LOCK).touch()  # another job is at it: this one leaves it
    slurm_jobs.end_sweep_once(tmp_path, "cfg")
    assert ended == ["cfg"]
    # a later batch (Optuna's) adds to the list; a fresh launch from job 0 starts it again
    slurm_jobs.write_jobs(tmp_path, [2], [["seed=3"]])
    assert [j["job"] for j in json.loads((tmp_path / "jobs.json").read_text())] == [0, 1, 2]
    slurm_jobs.write_jobs(tmp_path, [0], [["seed=1"]])
    assert [j["job"] for j in json.loads((tmp_path / "jobs.json").read_text())] == [0]
    assert not (tmp_path / slurm_jobs.FINISHED_DIR).exists()
