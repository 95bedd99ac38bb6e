"""Experiment loggers beyond the CSV default, and what every run records about itself.

Privacy: sessions hold faces, voices, transcripts and participant ids. By default the W&B run
uploads only metrics, the resolved config, run metadata (git commit, split and feature-store
hashes) and plots: console capture, code and machine metadata are off, because the console logs
name sessions. `logger.wandb.upload_private=true` is the explicit opt-in that turns them back on.
W&B keys come from the environment (`WANDB_API_KEY`, or `wandb login`), never from a config.
"""
from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, MLFlowLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from empathic_fusion.utils import PACKAGE_DIR

log = logging.getLogger(__name__)

WANDB_ID_FILE = "wandb_run_id"


def wandb_logger(save_dir: str, project: str = "empathic-fusion", group: str | None = None,
                 default_group: str = "train", name: str | None = None, tags: list[str] | None = None,
                 extra_tags: list[str] | None = None, entity: str | None = None, offline: bool = False,
                 log_model: bool = False, upload_private: bool = False, job_type: str = "train") -> WandbLogger:
    """A WandbLogger for one job: grouped by experiment, tagged, private data off unless opted in.

    The run id is kept in `save_dir`, so a requeued or resumed job (same run folder) continues the
    same W&B run instead of opening a second one.
    """
    import wandb

    root = Path(save_dir)
    id_file = root / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else wandb.util.generate_id()
    if rank_zero_only.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id)
    private = bool(upload_private)
    settings = wandb.Settings(console="auto" if private else "off", save_code=private, disable_code=not private,
                              disable_git=not private, x_disable_meta=not private,
                              x_save_requirements=private)
    all_tags = sorted({str(t) for t in [*(tags or []), *(extra_tags or [])] if t is not None})
    return WandbLogger(save_dir=str(root), project=project, group=group or default_group, name=name,
                       tags=all_tags, entity=entity, offline=offline, log_model=log_model, id=run_id,
                       resume="allow", job_type=job_type, settings=settings)


def mlflow_logger(tracking_uri: str | None = None, tracking_dir: str | None = None,
                  experiment_name: str = "empathic-fusion", run_name: str | None = None,
                  tags: dict[str, Any] | None = None, log_model: bool = False) -> MLFlowLogger:
    """An MLFlowLogger on a sqlite database in `tracking_dir` (MLflow's file store needs an opt-in
    environment variable) or on any `tracking_uri`, e.g. an MLflow server for parallel sweeps."""
    if tracking_uri is None:
        if tracking_dir is None:
            raise ValueError("mlflow_logger needs tracking_uri or tracking_dir")
        folder = Path(tracking_dir).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        tracking_uri = f"sqlite:///{folder / 'mlflow.db'}"
    clean_tags = {str(k): str(v) for k, v in (tags or {}).items() if v is not None}
    return MLFlowLogger(experiment_name=experiment_name, run_name=run_name, tracking_uri=tracking_uri,
                        tags=clean_tags or None, log_model=log_model)


def git_commit(root: Path = PACKAGE_DIR) -> str:
    """HEAD's commit, suffixed `-dirty` when tracked files changed; 'unknown' outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def run_metadata(cfg: DictConfig, data_info: dict[str, Any]) -> dict[str, Any]:
    """What a run logs about itself: the resolved config (without Hydra's own), code and data identity."""
    config = {key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
              for key in cfg if key != "hydra"}
    return {"git_commit": git_commit(), "split_hash": data_info.get("split_hash"),
            "feature_manifest_hash": data_info.get("feature_manifest_hash"), "config": config}


@rank_zero_only
def log_run_metadata(loggers: list[Logger], metadata: dict[str, Any], out_dir: Path) -> None:
    """Send the metadata to every logger as hyperparameters and keep it as run_info.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "run_info.json").write_text(json.dumps(metadata, indent=1, default=str))
    for logger in loggers:
        logger.log_hyperparams(metadata)


def finish_loggers(loggers: list[Logger], failed: bool) -> None:
    """Close this job's W&B run (one run per multirun job) and mark MLflow runs failed on errors."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and getattr(logger, "_experiment", None) is not None:
            logger.experiment.finish(exit_code=1 if failed else 0)
            logger._experiment = None
        elif failed and isinstance(logger, MLFlowLogger):
            logger.finalize("failed")
