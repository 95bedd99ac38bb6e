"""Scale-out configs compose (launchers, Optuna search, loggers, DDP trainers), the sweeper gets a
validation metric, and a failing multirun job is recorded instead of stopping the sweep."""
from __future__ import annotations

import json
import math
from pathlib import Path

import hydra
import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

import empathic_fusion.utils.multirun as multirun
from empathic_fusion.utils import CONFIG_DIR
from empathic_fusion.compose import compose_config

CONF = CONFIG_DIR
# conf/hydra/launcher/submitit_*.yaml keep the plugin's names and are checked against its schema on purpose
pytestmark = pytest.mark.filterwarnings("ignore:.*validated against ConfigStore schema")


_compose = compose_config


def test_optuna_search_minimizes_a_validation_metric(tmp_path):
    cfg = _compose(["hparams_search=optuna"], tmp_path)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_.endswith("OptunaSweeper") and "TPESampler" in sweeper.sampler._target_
    assert cfg.optimized_metric.startswith("val/") and sweeper.direction == "minimize"
    assert sweeper.n_trials > 1 and "model.optimizer.lr" in sweeper.params
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"


@pytest.mark.parametrize("launcher,target", [("submitit_slurm", "SlurmLauncher"), ("submitit_local", "LocalLauncher"),
                                             ("shared_device", "JoblibLauncher")])
def test_launchers_compose_and_instantiate(launcher, target, tmp_path):
    cfg = _compose([f"hydra/launcher={launcher}"], tmp_path)
    assert cfg.hydra.launcher._target_.endswith(target)
    if launcher == "submitit_slurm":  # resources and requeue live in the config
        for key in ("partition", "gpus_per_node", "timeout_min", "mem_gb", "array_parallelism"):
            assert key in cfg.hydra.launcher
        assert cfg.hydra.launcher.max_num_timeout > 0
    if launcher == "shared_device":  # several jobs at once, in fresh processes (CUDA cannot be used after fork)
        assert cfg.hydra.launcher.n_jobs > 1 and cfg.hydra.launcher.backend == "loky"
    hydra.utils.instantiate(cfg.hydra.launcher)


def test_wandb_runs_are_grouped_and_tagged_and_private_data_stays_off(tmp_path):
    cfg = _compose(["logger=many", "experiment=demo", "model=tfn", "modality=v+t", "seed=3"], tmp_path)
    assert set(cfg.logger) == {"csv", "tensorboard", "wandb", "mlflow"}
    logger = hydra.utils.instantiate(cfg.logger.wandb)
    init = logger._wandb_init
    assert init["group"] == "demo" and init["project"] == "empathic-fusion"
    assert {"model=tfn", "modality=v+t", "seed=3", "demo"} <= set(init["tags"])
    settings = init["settings"]
    assert settings.console == "off" and not settings.save_code and settings.x_disable_meta
    # a requeued job (same run folder) continues the same W&B run
    assert hydra.utils.instantiate(cfg.logger.wandb)._wandb_init["id"] == init["id"]
    assert "api_key" not in str(cfg.logger)  # keys come from the environment only


def test_metric_for_the_sweeper_is_validation_only():
    results = {"validation": {"val/loss": 0.3, "val/rating/pearson": 0.5}, "best_validation": {"val/loss": 0.2},
               "model": {"rating": {"pearson": 0.9}}}
    assert multirun.metric_value(results, "val/loss") == 0.2  # the checkpoint's best, not the last epoch's
    assert multirun.metric_value(results, "val/rating/pearson") == 0.5
    assert multirun.metric_value({"validation": {"val/loss": math.nan}}, "val/loss") is None
    assert multirun.metric_value({"skipped": True}, "val/loss") is None
    with pytest.raises(ValueError, match="validation metric"):
        multirun.metric_value(results, "test/rating/pearson")


def _failing(cfg):
    raise RuntimeError("out of memory on purpose")


def _as_sweep_job(cfg, sweep_dir: Path, num: int, overrides: list[str], output_dir: Path | None = None) -> None:
    """Make `cfg` the running Hydra config of job `num` of a multirun in `sweep_dir`."""
    OmegaConf.set_readonly(cfg.hydra, False)
    with open_dict(cfg):
        cfg.hydra.mode = "MULTIRUN"
        cfg.hydra.sweep.dir = str(sweep_dir)
        cfg.hydra.job.num = num
        cfg.hydra.overrides.task = overrides
        if output_dir is not None:
            cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig().set_config(cfg)


def test_failing_multirun_job_is_recorded_and_listed(tmp_path):
    cfg = _compose([], tmp_path)
    with pytest.raises(RuntimeError):  # a single run still raises
        multirun.run_job(_failing, cfg)
    _as_sweep_job(cfg, tmp_path / "sweep", 3, ["seed=5"])
    assert multirun.run_job(lambda c: {"best_validation": {"val/loss": 0.25}}, cfg) == 0.25
    assert multirun.run_job(_failing, cfg) is None
    multirun.FailureReport().on_multirun_end(cfg)
    listed = json.loads((tmp_path / "sweep" / "failures.json").read_text())
    assert listed == [{"job": 3, "overrides": ["seed=5"], "error": "RuntimeError: out of memory on purpose"}]


def test_a_job_run_again_replaces_its_failure_record(tmp_path):
    """A sweep run a second time: a job that fails records its run folder (the sweep's tables then leave out
    what an earlier run left there), and one that succeeds this time drops its old record and the old list."""
    cfg = _compose([], tmp_path)
    _as_sweep_job(cfg, tmp_path / "sweep", 0, ["seed=1"], tmp_path / "sweep" / "0")
    assert multirun.run_job(_failing, cfg) is None
    multirun.FailureReport().on_multirun_end(cfg)
    assert multirun.failed_run_dirs(tmp_path / "sweep") == {(tmp_path / "sweep" / "0").resolve()}
    assert (tmp_path / "sweep" / "failures.json").is_file()
    assert multirun.run_job(lambda c: {"best_validation": {"val/loss": 0.25}}, cfg) == 0.25  # the sweep again
    multirun.FailureReport().on_multirun_end(cfg)
    assert multirun.collect_failures(tmp_path / "sweep") == [] and not (tmp_path / "sweep" / "failures.json").exists()
