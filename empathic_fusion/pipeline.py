"""What train.py and evaluate.py run, kept out of the entry points so tests can call it."""
from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from empathic_fusion.config import validate
from empathic_fusion.datamodules.empathy_datamodule import EmpathyDataModule
from empathic_fusion.evaluation.report import build_report, format_ci, predict_split
from empathic_fusion.evaluation.report import settings as report_settings
from empathic_fusion.evaluation.sweep import evaluate_sweep, skip_incompatible_cell
from empathic_fusion.metrics import METRIC_NAMES, empathy_metrics, format_table
from empathic_fusion.models.empathy_module import EmpathyModule
from empathic_fusion.text.model import CHECKPOINT_KEY as TEXT_CHECKPOINT_KEY
from empathic_fusion.text.pipeline import (build_text_datamodule, build_text_module, is_text_config, load_text_checkpoint,
                               report_text_test, robustness_report)
from empathic_fusion.utils.loggers import finish_loggers, log_run_metadata, run_metadata

log = logging.getLogger(__name__)


def build_datamodule(data_cfg: dict, features_cfg: dict, modalities: list[str]) -> EmpathyDataModule:
    return hydra.utils.instantiate(data_cfg, modalities=list(modalities), features=features_cfg, _convert_="all")


def _instantiate_all(group: DictConfig | None) -> list:
    if not group:
        return []
    return [hydra.utils.instantiate(c) for c in group.values() if isinstance(c, DictConfig) and "_target_" in c]


def report_test(model: EmpathyModule, datamodule: EmpathyDataModule, out_dir: Path, title: str,
                loggers: list | tuple = (), evaluation: dict[str, Any] | None = None) -> dict:
    """Print the test table (with the train-mean constant baseline) and write metrics, predictions
    (with session, participant, story), the per-participant breakdown, bootstrap CIs and plots.

    `evaluation` (conf: `evaluation:`) picks the Acc/F1 threshold mode (`fixed` from the model config,
    or `validation`: the prediction cutoff that maximises F1 on the validation split), the number of
    participant resamples for the CIs and whether to draw plots; see empathic_fusion/evaluation/report.py.
    """
    settings = report_settings(evaluation)
    predictions = model.test_predictions
    val_predictions = None
    if settings["threshold"] == "validation":
        val_predictions = predict_split(model, datamodule.val_dataloader())
    report = build_report(predictions, datamodule.ratings, model.threshold, float(model.hparams.threshold_rating),
                          out_dir, settings, val_predictions, loggers)
    results = report["results"]
    constant = datamodule.train_target_mean
    with warnings.catch_warnings():  # a constant's correlation is undefined; reported as 0 by design
        warnings.simplefilter("ignore")
        baseline = {level: empathy_metrics(torch.full_like(predictions[f"{level}_target"], constant),
                                           predictions[f"{level}_target"], model.threshold)
                    for level in ("window", "rating")}
    rows = {f"{title} (per window)": results["window"], f"{title} (per rating)": results["rating"],
            "constant train mean (per window)": baseline["window"],
            "constant train mean (per rating)": baseline["rating"]}
    table = format_table(rows)
    ci_table = format_ci(report["ci"], float(settings["confidence"]), METRIC_NAMES) if report["ci"] else ""
    print(f"\nTest metrics ({datamodule.scenario}, modalities {'+'.join(datamodule.modalities)}; "
          f"MSE on the cosine scale (rating-3)/2):\n{table}\n\n{ci_table}\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {"model": results, "constant_baseline": baseline, "thresholds": report["thresholds"],
               "ci": report["ci"], "confidence": float(settings["confidence"]), "participants": report["participants"]}
    (out_dir / "test_metrics.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "test_metrics.md").write_text(table + "\n\n" + ci_table + "\n")
    rows_csv = [{"row": name, **values} for name, values in rows.items()]
    pd.DataFrame(rows_csv).to_csv(out_dir / "test_metrics.csv", index=False)
    return summary


def train(cfg: DictConfig, extra_callbacks: list[L.Callback] | None = None) -> dict[str, Any]:
    """Prepare data, train (continuing a killed run from its last.ckpt), test the best checkpoint.

    Returns the test results plus `validation` (the last epoch's val/ metrics), `best_validation`
    (the checkpoint monitor's best value) and `global_step`, so a sweeper can optimize a validation
    metric (empathic_fusion/utils/multirun.py). Loggers get the resolved config, git commit, split hash and
    feature-store manifest hash; a W&B run is closed when the job ends, also when it fails.
    `extra_callbacks` are added to the configured ones (for programmatic use).
    """
    validate(cfg)
    L.seed_everything(cfg.seed, workers=True)
    out_dir = Path(cfg.paths.output_dir)
    if (skipped := skip_incompatible_cell(cfg, out_dir)) is not None:  # a sweep grid cell the model cannot run
        return skipped
    text = is_text_config(cfg.data)
    if text:  # a text table: TextDataModule + TextEmpathyModule (empathic_fusion/text/), same Trainer, loggers, checkpoints
        datamodule = build_text_datamodule(OmegaConf.to_container(cfg.data, resolve=True))
        datamodule.setup("fit")
        model = build_text_module(cfg, datamodule)
    else:
        datamodule, model = _fusion_run(cfg)
    loggers = _instantiate_all(cfg.get("logger"))
    callbacks = _instantiate_all(cfg.get("callbacks")) + list(extra_callbacks or [])
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    log.info("data: %s", datamodule.describe())
    failed = True
    try:
        log_run_metadata(loggers, run_metadata(cfg, datamodule.describe()), out_dir)
        if cfg.get("train", True):
            # weights_only=False: a text run's checkpoint holds fitted vocabularies and ridge coefficients
            trainer.fit(model, datamodule=datamodule, ckpt_path=resolve_ckpt_path(cfg.get("ckpt_path"), trainer),
                        weights_only=False)
        validation = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        checkpoint = trainer.checkpoint_callback
        best_validation = ({checkpoint.monitor: float(checkpoint.best_model_score)}
                           if checkpoint is not None and checkpoint.monitor and checkpoint.best_model_score is not None
                           else {})
        results: dict[str, Any] = {}
        if cfg.get("test", True):
            best = checkpoint.best_model_path if checkpoint else ""
            trainer.test(model, datamodule=datamodule, ckpt_path=best or None, weights_only=False)
            title = cfg.model.net._target_.rsplit(".", 1)[-1]
            if trainer.is_global_zero and text:
                results = report_text_test(model, datamodule, out_dir, title, trainer.loggers,
                                           float(cfg.model.get("threshold_rating", 3.0)),
                                           _container(cfg.model.get("baselines")))
                robust = robustness_report(best, datamodule, _container(cfg.model.get("robustness")), cfg.seed, out_dir)
                if robust is not None:
                    results["robustness"] = str(robust)
            elif trainer.is_global_zero:  # under DDP every process has the gathered predictions; one reports
                results = report_test(model, datamodule, out_dir, title, loggers=trainer.loggers,
                                      evaluation=_container(cfg.get("evaluation")))
            results["best_checkpoint"] = best
        results.update(validation=validation, best_validation=best_validation, global_step=trainer.global_step)
        failed = False
    finally:
        finish_loggers(trainer.loggers, failed)
    return results


def _fusion_run(cfg: DictConfig) -> tuple[EmpathyDataModule, EmpathyModule]:
    datamodule = build_datamodule(OmegaConf.to_container(cfg.data, resolve=True),
                                  OmegaConf.to_container(cfg.features, resolve=True), list(cfg.modality.names))
    datamodule.prepare_data()
    datamodule.setup("fit")
    model = EmpathyModule(
        net=OmegaConf.to_container(cfg.model.net, resolve=True), modalities=list(cfg.modality.names),
        input_dims=datamodule.input_dims, head=cfg.model.head,
        optimizer=OmegaConf.to_container(cfg.model.optimizer, resolve=True),
        scheduler=OmegaConf.to_container(cfg.model.scheduler, resolve=True),
        threshold_rating=cfg.model.threshold_rating, data_info=datamodule.describe(),
        run_config={"data": OmegaConf.to_container(cfg.data, resolve=True),
                    "features": OmegaConf.to_container(cfg.features, resolve=True),
                    "modality": OmegaConf.to_container(cfg.modality, resolve=True),
                    "model": OmegaConf.to_container(cfg.model, resolve=True)})
    return datamodule, model


def resolve_ckpt_path(ckpt_path: str | None, trainer: L.Trainer) -> str | None:
    """Where fit continues from. `last` or null: the run folder's last.ckpt when it exists (a job
    killed or requeued into the same folder resumes on its own); null also leaves Lightning's SLURM
    `hpc_ckpt_*.ckpt` to Lightning. A path: that checkpoint, which must exist."""
    if ckpt_path not in (None, "last"):
        if not Path(ckpt_path).is_file():
            raise FileNotFoundError(f"ckpt_path={ckpt_path} does not exist")
        return str(ckpt_path)
    if ckpt_path is None and list(Path(trainer.default_root_dir).glob("hpc_ckpt_*.ckpt")):
        return None  # Lightning restores its own SLURM requeue checkpoint
    dirs = {Path(cb.dirpath) for cb in trainer.checkpoint_callbacks if getattr(cb, "dirpath", None)}
    found = sorted((d / "last.ckpt" for d in dirs if (d / "last.ckpt").is_file()), key=lambda p: p.stat().st_mtime)
    if found:
        log.info("resuming from %s", found[-1])
        return str(found[-1])
    if ckpt_path == "last":
        log.warning("ckpt_path=last but no last.ckpt in %s: training from scratch", sorted(map(str, dirs)))
    return None


def _container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluate one checkpoint (`ckpt_path`) on the data it was trained on, or a sweep directory
    (`sweep_dir`) into paper tables; data.* overrides apply to a checkpoint's data."""
    validate(cfg)
    if sum(bool(cfg.get(k)) for k in ("ckpt_path", "sweep_dir", "judge")) != 1:
        raise ValueError("give exactly one of ckpt_path=<file.ckpt>, sweep_dir=<multirun folder> or "
                         "judge=llm_judge (with +data=<text data>)")
    out_dir = Path(cfg.paths.output_dir)
    if cfg.get("sweep_dir"):
        tables = cfg.get("tables") or {}
        result = evaluate_sweep(cfg.sweep_dir, cfg.get("out_dir") or out_dir,
                                tuple(tables.get("metrics") or METRIC_NAMES), float(tables.get("scale", 100.0)),
                                int(tables.get("decimals", 1)), bool(tables.get("plots", True)))
        for level, paths in result["paths"].items():
            print(f"\n{level}-level results ({cfg.sweep_dir}):\n{paths['md'].read_text()}")
        return result
    if cfg.get("judge"):
        from empathic_fusion.text.llm_judge import evaluate_judge

        return evaluate_judge(cfg, out_dir)
    checkpoint = torch.load(cfg.ckpt_path, map_location="cpu", weights_only=False)
    if TEXT_CHECKPOINT_KEY in checkpoint:
        return _evaluate_text(cfg, out_dir)
    evaluation = _container(cfg.get("evaluation"))
    if cfg.split == "val" and (evaluation or {}).get("threshold") == "validation":
        raise ValueError("evaluation.threshold=validation chooses the cutoff on the validation split; "
                         "scoring that same split with it would be optimistic: use split=test or threshold=fixed")
    run_config = checkpoint["hyper_parameters"]["run_config"]
    data_cfg = {**run_config["data"], **OmegaConf.to_container(cfg.data, resolve=True)}
    features_cfg = {**run_config["features"], **OmegaConf.to_container(cfg.features, resolve=True)}
    datamodule = build_datamodule(data_cfg, features_cfg, run_config["modality"]["names"])
    datamodule.prepare_data()
    datamodule.setup("test")
    model = EmpathyModule.load_from_checkpoint(cfg.ckpt_path, map_location="cpu", weights_only=False)
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, logger=False)
    loader = {"test": datamodule.test_dataloader, "val": datamodule.val_dataloader}[cfg.split]
    trainer.test(model, dataloaders=loader())
    return report_test(model, datamodule, out_dir, run_config["model"]["net"]["_target_"].rsplit(".", 1)[-1],
                       evaluation=evaluation)


def _evaluate_text(cfg: DictConfig, out_dir: Path) -> dict[str, Any]:
    """A text checkpoint on its own test fold (split=test), validation part (split=val) or every
    row of a new table (`test_csv=<file>`, same columns), through trainer.test."""
    data_overrides = OmegaConf.to_container(cfg.data, resolve=True) if cfg.get("data") else {}
    model, datamodule = load_text_checkpoint(cfg.ckpt_path, data_overrides, cfg.get("test_csv"))
    if cfg.split == "val" and not cfg.get("test_csv"):
        datamodule.test_rows = datamodule.val_rows
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, logger=False)
    trainer.test(model, datamodule=datamodule)
    model_cfg = model.hparams.run_config["model"]
    return report_text_test(model, datamodule, out_dir, model_cfg["net"]["_target_"].rsplit(".", 1)[-1],
                            threshold_rating=float(model_cfg.get("threshold_rating", 3.0)),
                            baselines_cfg=model_cfg.get("baselines") if not cfg.get("test_csv") else {"enabled": False})
