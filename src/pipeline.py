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

from src.datamodules.empathy_datamodule import EmpathyDataModule
from src.metrics import empathy_metrics, format_table
from src.models.empathy_module import EmpathyModule

log = logging.getLogger(__name__)


def build_datamodule(data_cfg: dict, features_cfg: dict, modalities: list[str]) -> EmpathyDataModule:
    return hydra.utils.instantiate(data_cfg, modalities=list(modalities), features=features_cfg, _convert_="all")


def _instantiate_all(group: DictConfig | None) -> list:
    if not group:
        return []
    return [hydra.utils.instantiate(c) for c in group.values() if isinstance(c, DictConfig) and "_target_" in c]


def report_test(model: EmpathyModule, datamodule: EmpathyDataModule, out_dir: Path, title: str) -> dict:
    """Print the test table (with the train-mean constant baseline) and write metrics and predictions."""
    results = model.results["test"]
    predictions = model.test_predictions
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
    print(f"\nTest metrics ({datamodule.scenario}, modalities {'+'.join(datamodule.modalities)}; "
          f"MSE on the cosine scale (rating-3)/2):\n{table}\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "test_metrics.json").write_text(json.dumps({"model": results, "constant_baseline": baseline}, indent=1))
    (out_dir / "test_metrics.md").write_text(table + "\n")
    rows_csv = [{"row": name, **values} for name, values in rows.items()]
    pd.DataFrame(rows_csv).to_csv(out_dir / "test_metrics.csv", index=False)
    pd.DataFrame({"rating_index": predictions["rating_index"].numpy(),
                  "predicted": predictions["rating_pred"].numpy() * 2 + 3,
                  "rated": predictions["rating_target"].numpy() * 2 + 3}).to_csv(
        out_dir / "test_predictions.csv", index=False)
    return {"model": results, "constant_baseline": baseline}


def train(cfg: DictConfig) -> dict[str, Any]:
    """Prepare data, train, test the best checkpoint; returns the test results."""
    L.seed_everything(cfg.seed, workers=True)
    out_dir = Path(cfg.paths.output_dir)
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
    trainer: L.Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=_instantiate_all(cfg.get("callbacks")),
                                                 logger=_instantiate_all(cfg.get("logger")) or False)
    log.info("data: %s", datamodule.describe())
    if cfg.get("train", True):
        trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    results: dict[str, Any] = {}
    if cfg.get("test", True):
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        trainer.test(model, datamodule=datamodule, ckpt_path=best or None, weights_only=False)
        results = report_test(model, datamodule, out_dir, cfg.model.net._target_.rsplit(".", 1)[-1])
        results["best_checkpoint"] = best
    return results


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Test a checkpoint on the data it was trained on (data.* overrides apply)."""
    checkpoint = torch.load(cfg.ckpt_path, map_location="cpu", weights_only=False)
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
    return report_test(model, datamodule, Path(cfg.paths.output_dir), run_config["model"]["net"]["_target_"].rsplit(".", 1)[-1])
