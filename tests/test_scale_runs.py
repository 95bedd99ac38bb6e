"""Scale-out runs on CPU with the tiny dataset: resume after a kill, several loggers at once, a
submitit_local sweep with W&B offline (one run per job, nothing private in them, a failing job
listed), a 2-trial Optuna search on a validation metric and a 2-process DDP run."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from empathic_fusion.datamodules.sampler import RatingOversampler
from empathic_fusion.pipeline import build_datamodule, train
from empathic_fusion.utils import PROJECT_ROOT
from empathic_fusion.compose import compose_config

pytestmark = pytest.mark.slow

pytestmark = pytest.mark.filterwarnings("ignore:.*validated against ConfigStore schema")

BATCH = 16


def _data_overrides(dataset: Path, store: Path) -> list[str]:
    """The tiny dataset with a small LF-LSTM on audio+text (the 2731-d video LSTM is ~8x slower on CPU)."""
    return [f"data.dataset_dir={dataset}", f"data.store_dir={store}", "data.demo=null", "data.extract_workers=1",
            "modality=a+t",
            "data.split_fractions=[0.6,0.2,0.2]", f"data.batch_size={BATCH}", "model=lf_lstm",
            "model.net.hidden_sizes={video:8,audio:8,text:8}", "model.net.representation_dim=16",
            "model.net.post_fusion_hidden=16", "model.head=regression", "model.optimizer.lr=1e-3",
            "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
            "evaluation=lean"]


@pytest.fixture(scope="module")
def tiny(tiny_dataset, tiny_store):
    """The tiny data, with its split persisted once here (parallel jobs then only read it)."""
    cfg = _cfg(_data_overrides(tiny_dataset, tiny_store), tiny_store.parent / "unused")
    datamodule = build_datamodule(OmegaConf.to_container(cfg.data, resolve=True),
                                  OmegaConf.to_container(cfg.features, resolve=True), list(cfg.modality.names))
    datamodule.setup("fit")
    classes = np.round(datamodule.datasets["train"].ratings).astype(int)
    return {"dataset": tiny_dataset, "store": tiny_store, "epoch_windows": RatingOversampler(classes).epoch_length}


_cfg = compose_config


class KillAfterFirstEpoch(L.Callback):
    """Stands in for a killed job: dies once the first epoch and its checkpoint are done (at the start
    of the second: ModelCheckpoint saves at the end of an epoch, after the other callbacks)."""

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            raise RuntimeError("killed after epoch 1")


def test_killed_run_resumes_at_the_same_step(tiny, tmp_path):
    common = _data_overrides(tiny["dataset"], tiny["store"]) + ["trainer.max_epochs=2", "+trainer.limit_train_batches=4",
                                                                 "test=false", "seed=4"]
    whole = train(_cfg(common + ["logger=[csv,tensorboard,mlflow]", f"logger.mlflow.tracking_dir={tmp_path}/mlflow"],
                       tmp_path / "whole"))
    assert whole["global_step"] == 2 * min(4, math.ceil(tiny["epoch_windows"] / BATCH))

    with pytest.raises(RuntimeError, match="killed after epoch 1"):
        train(_cfg(common, tmp_path / "killed"), extra_callbacks=[KillAfterFirstEpoch()])
    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == whole["global_step"] // 2
    resumed = train(_cfg(common + ["ckpt_path=last"], tmp_path / "killed"))
    assert resumed["global_step"] == whole["global_step"]
    assert resumed["best_validation"]["val/loss"] > 0

    # every logger of the uninterrupted run got the metrics and the run's identity
    info = json.loads((tmp_path / "whole" / "run_info.json").read_text())
    assert len(info["split_hash"]) >= 8 and info["feature_manifest_hash"] and info["git_commit"]
    assert info["config"]["model"]["optimizer"]["lr"] == 1e-3 and "hydra" not in info["config"]
    assert list((tmp_path / "whole" / "tensorboard").rglob("events.out.tfevents.*"))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("empathic-fusion").experiment_id])
    assert run.data.params["split_hash"] == info["split_hash"] and "val/loss" in run.data.metrics


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb_home"), "WANDB_SILENT": "true",
            "WANDB_CONFIG_DIR": str(tmp_path / "wandb_home"), "WANDB_CACHE_DIR": str(tmp_path / "wandb_home"),
            "WANDB_DATA_DIR": str(tmp_path / "wandb_home"), "PYTHONWARNINGS": "ignore"}


def _train_py(args: list[str], env: dict[str, str], timeout: int = 400, status: int = 0) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, str(PROJECT_ROOT / "train.py"), *args], cwd=PROJECT_ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == status, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def _private_strings(dataset: Path) -> list[str]:
    """Participant ids, what participants said and the stories' texts."""
    participants = pd.read_csv(dataset / "participants.csv").participant_id.tolist()
    said = [t for f in (dataset / "transcripts").glob("*.csv") for t in
            pd.read_csv(f).query("speaker == 'participant'").text.dropna().tolist()]
    stories = pd.read_csv(dataset / "stories.csv")
    texts = [t for c in stories.columns if c.endswith("text") for t in stories[c].dropna().tolist()]
    return participants + said + texts


def _reused_setup(run_dir: Path) -> bool:
    return "set up by job" in (run_dir / "train.log").read_text()


def test_shared_device_workers_take_jobs_in_turn_and_match_a_sequential_sweep(tiny, tmp_path):
    """hydra/launcher=shared_device: two long-lived worker processes train the sweep's jobs at once, each taking
    jobs in turn and keeping its data's set-up between them; every job's metrics equal those of the same sweep run
    one job after another (basic launcher) on the same seeds."""
    shared, sequential, met = tmp_path / "shared", tmp_path / "sequential", tmp_path / "met"
    # each job waits at the start of its training until two processes have got there (tests/rendezvous.py): jobs
    # run one after another would never meet, and the sweep would record the first one's failure
    env = {**_env(tmp_path), "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT / "tests"),
                                                                         os.environ.get("PYTHONPATH")]))}
    common = [*_data_overrides(tiny["dataset"], tiny["store"]), "logger=[csv]", "trainer.max_epochs=2", "threads=1",
              "seed=1,2,3,4"]
    _train_py(["-m", *common, "hydra/launcher=shared_device", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={shared}",
               "+callbacks.rendezvous._target_=rendezvous.Rendezvous", f"+callbacks.rendezvous.folder={met}"], env)
    _train_py(["-m", *common, f"hydra.sweep.dir={sequential}"], env)
    assert not (shared / "failures.json").exists()
    assert len(list(met.iterdir())) == 2  # 4 jobs in two processes, which met: the workers outlive their first job
    for job in range(4):
        metrics = [json.loads((sweep / str(job) / "test_metrics.json").read_text())["model"]["rating"]
                   for sweep in (shared, sequential)]
        assert math.isfinite(metrics[0]["mse"]) and metrics[0] == pytest.approx(metrics[1], rel=1e-6, abs=1e-9)
    # one process sets up the data once: later jobs reuse it (a worker's second job, the sequential sweep's 2nd-4th)
    assert sum(_reused_setup(shared / str(job)) for job in range(4)) == 2
    assert [_reused_setup(sequential / str(job)) for job in range(4)] == [False, True, True, True]
    timings = [json.loads((sequential / str(job) / "timings.json").read_text()) for job in range(4)]
    assert "setup/frames" in timings[0]["seconds"] and not any("setup/frames" in t["seconds"] for t in timings[1:])
    assert all(t["counts"]["epochs"] == 2 and t["seconds"]["train_steps"] > 0 for t in timings)


def test_submitit_local_sweep_with_wandb_offline(tiny, tmp_path):
    sweep = tmp_path / "sweep"
    _train_py(["-m", *_data_overrides(tiny["dataset"], tiny["store"]), "hydra/launcher=submitit_local",
               f"hydra.sweep.dir={sweep}", "logger=[csv,wandb]", "trainer.max_epochs=1",
               "model.optimizer.lr=1e-3,2e-3,-1", "seed=2"], _env(tmp_path), status=1)
    # the job with a negative learning rate failed; the other two completed, the failure is listed and the sweep
    # exits with status 1
    assert (sweep / "0" / "test_metrics.json").exists() and (sweep / "1" / "test_metrics.json").exists()
    (failure,) = json.loads((sweep / "failures.json").read_text())
    assert failure["job"] == 2 and "model.optimizer.lr=-1" in failure["overrides"] and "learning rate" in failure["error"]

    # the settings check refuses job 2 before any logger starts: no W&B run for it
    runs = {job: list((sweep / str(job) / "wandb").glob("offline-run-*")) for job in range(3)}
    assert len(runs[0]) == 1 and len(runs[1]) == 1 and not runs[2], runs  # one W&B run per job, closed between jobs
    ids = [(sweep / str(job) / "wandb_run_id").read_text() for job in range(2)]
    assert len(set(ids)) == 2 and all(runs[job][0].name.endswith(ids[job]) for job in range(2))
    runs.pop(2)
    private = [s for s in _private_strings(tiny["dataset"]) if len(s) >= 4]
    assert len(private) > 40
    checked = 0
    for found in runs.values():
        for path in found[0].rglob("*"):
            if path.is_file():
                content = path.read_bytes().decode("utf-8", errors="ignore")
                leaked = [s for s in private if s in content]
                assert not leaked, f"{path} contains {leaked[:3]}"
                checked += 1
    assert checked >= 3


def test_optuna_search_optimizes_validation_loss(tiny, tmp_path):
    sweep = tmp_path / "optuna"
    _train_py(["hparams_search=optuna", f"hydra.sweep.dir={sweep}", "hydra.sweeper.n_trials=2",
               "hydra.sweeper.sampler.n_startup_trials=1", "trainer.max_epochs=1", "test=false", "logger=csv",
               *_data_overrides(tiny["dataset"], tiny["store"])], _env(tmp_path))
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    val_losses = []
    for job in ("0", "1"):
        metrics = pd.read_csv(next((sweep / job / "csv").rglob("metrics.csv")))
        val_losses.append(metrics["val/loss"].dropna().min())
        assert not [c for c in metrics.columns if c.startswith("test/")]  # nothing was tested
    assert best["best_value"] == pytest.approx(min(val_losses), rel=1e-5)
    # lr and batch size are fixed by the overrides above, so the search ran over weight decay
    assert set(best["best_params"]) == {"model.optimizer.weight_decay"}


def test_ddp_on_two_cpu_processes_shards_the_oversampled_epoch(tiny, tmp_path):
    out = tmp_path / "ddp"
    _train_py(["trainer=ddp_cpu", f"hydra.run.dir={out}", "trainer.max_epochs=1", "logger=csv",
               *_data_overrides(tiny["dataset"], tiny["store"])], _env(tmp_path))
    steps = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    # each process ran half of the epoch's oversampled windows (not all of them, not padded)
    assert steps == math.ceil((tiny["epoch_windows"] // 2) / BATCH)
    assert json.loads((out / "test_metrics.json").read_text())["model"]["rating"]["mse"] > 0
