"""What `python train.py data=<text table> model=text_regressor` runs: grouped K-fold CV of the text
model next to majority-class, training-mean and TF-IDF + ridge baselines, then (optionally) a final
model on every row, saved as model.pt, with its robustness report.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from src.text import baselines
from src.text.datamodule import TextDataModule
from src.text.encoder import TextEncoder
from src.text.metrics import format_fold_table, summarize_folds, text_metrics
from src.text.model import OVERALL, TextRegressorModule
from src.text.scorer import TextScorer, build_module, save_bundle

log = logging.getLogger(__name__)


def build_text_datamodule(data_cfg: dict) -> TextDataModule:
    return hydra.utils.instantiate(data_cfg, _convert_="all")


def _outputs(label_names: list[str], pred: np.ndarray, target: np.ndarray,
             levels: tuple[int, int] | None) -> dict[str, dict[str, float]]:
    out = {name: text_metrics(pred[:, j], target[:, j], levels) for j, name in enumerate(label_names)}
    if len(label_names) > 1:
        out[OVERALL] = text_metrics(pred.mean(1), target.mean(1), levels)
    return out


def fit_module(settings: dict, dm: TextDataModule, encoder: TextEncoder, trainer_cfg: dict, seed: int,
               use_persona: bool | None = None) -> TextRegressorModule:
    """Train one module on the datamodule's current fold; the best validation epoch's weights are kept."""
    L.seed_everything(seed, workers=True)
    settings = dict(settings) if use_persona is None else {**settings, "use_persona": use_persona}
    module = build_module(settings, dm.spec.label_columns, dm.spec.fields, dm.persona, dm.target_mean,
                          dm.target_std, dm.levels, encoder)
    trainer = L.Trainer(**{**trainer_cfg, "max_epochs": settings.get("max_epochs", 30), "logger": False,
                           "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
                           "num_sanity_val_steps": 0})
    threads = torch.get_num_threads()
    if encoder.frozen:  # only a small MLP trains: intra-op threads cost more (start, sync) than they bring
        torch.set_num_threads(1)
    try:
        trainer.fit(module, train_dataloaders=dm.train_dataloader(),
                    val_dataloaders=dm.val_dataloader() if len(dm.val_rows) else None)
    finally:
        torch.set_num_threads(threads)
    module.restore_best()
    return module


def predict(module: TextRegressorModule, dm: TextDataModule, rows: np.ndarray) -> np.ndarray:
    module.eval()
    preds = []
    with torch.no_grad():
        for start in range(0, len(rows), 256):
            preds.append(module.predict_scores(dm.collate(list(rows[start:start + 256]))).cpu().numpy())
    module.train()
    return np.concatenate(preds) if preds else np.zeros((0, len(dm.spec.label_columns)), dtype=np.float32)


def _trainer_kwargs(cfg: DictConfig) -> dict:
    """The accelerator settings of the trainer group on one device (a fold's head trains in seconds);
    epochs, logging and checkpoints are the text pipeline's."""
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True) if "trainer" in cfg else {}
    keep = ("accelerator", "precision", "deterministic", "gradient_clip_val")
    return {**{k: trainer[k] for k in keep if k in trainer}, "devices": 1}


def cross_validate(cfg: DictConfig, dm: TextDataModule, encoder: TextEncoder) -> tuple[dict, pd.DataFrame, list[dict]]:
    """Per fold: the model (and, with persona columns and persona_ablation, the model without persona)
    and the baselines; returns the summary per row and output, out-of-fold predictions, per-fold metrics."""
    settings = OmegaConf.to_container(cfg.model, resolve=True)
    names = list(dm.spec.label_columns)
    title = settings.get("name", "text_regressor")
    per_fold: list[dict] = []
    predictions = []
    for k in dm.fold_ids:
        dm.use_fold(k)
        train_all = np.concatenate([dm.train_rows, dm.val_rows])
        test, targets = dm.test_rows, dm.targets[dm.test_rows]
        rows = {title: predict(fit_module(settings, dm, encoder, _trainer_kwargs(cfg), cfg.seed + k), dm, test)}
        if settings.get("persona_ablation") and dm.spec.persona_columns and settings.get("use_persona", True):
            rows[f"{title} without persona"] = predict(
                fit_module(settings, dm, encoder, _trainer_kwargs(cfg), cfg.seed + k, use_persona=False), dm, test)
        alpha = settings.get("ridge_alpha")
        rows["TF-IDF + ridge"] = baselines.tfidf_ridge(dm.fields, dm.targets, dm.train_rows, test, alpha, dm.val_rows)
        if len(dm.fields) > 1:  # the scored text alone: extra fields can hurt a bag of words
            first = dm.spec.fields[0]
            rows["TF-IDF + ridge (text only)"] = baselines.tfidf_ridge({first: dm.fields[first]}, dm.targets,
                                                                       dm.train_rows, test, alpha, dm.val_rows)
        rows["training mean"] = baselines.train_mean(dm.targets[train_all], len(test))
        rows["majority class"] = baselines.majority_class(dm.targets[train_all], len(test))
        for row, pred in rows.items():
            for output, values in _outputs(names, pred, targets, dm.levels).items():
                per_fold.append({"fold": k, "row": row, "output": output, **values})
        frame = pd.DataFrame({"row_index": test, "fold": k})
        for j, name in enumerate(names):
            frame[f"{name}_true"] = targets[:, j]
            frame[f"{name}_pred"] = rows[title][:, j]
        predictions.append(frame)
        log.info("fold %d rho (%s): %s", k, names[0],
                 {r: round(text_metrics(p[:, 0], targets[:, 0], dm.levels)["spearman"], 3) for r, p in rows.items()})
        if encoder.frozen:
            encoder.save_cache()
    folds = pd.DataFrame(per_fold)
    summary: dict[str, dict[str, dict]] = {}
    metric_names = [c for c in folds.columns if c not in ("fold", "row", "output")]
    for (output, row), group in folds.groupby(["output", "row"], sort=False):
        summary.setdefault(output, {})[row] = summarize_folds(group[metric_names].to_dict("records"))
    return summary, pd.concat(predictions, ignore_index=True), per_fold


def train_text(cfg: DictConfig) -> dict[str, Any]:
    """Grouped K-fold CV with baselines, then the final model, model.pt and the robustness report."""
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dm = build_text_datamodule(OmegaConf.to_container(cfg.data, resolve=True))
    dm.setup()
    log.info("text data: %s", dm.describe())
    if cfg.model.get("name") == "llm_judge":
        from src.text.llm_judge import evaluate_judge

        return evaluate_judge(cfg, dm, out_dir)
    enc = cfg.model.encoder
    encoder = TextEncoder(enc.get("model_path"), enc.get("trainable_layers", 0), enc.get("max_length", 128),
                          enc.get("batch_size", 64), enc.get("cache_dir"))
    if encoder.frozen:
        encoder.warm(dm.all_texts())
        encoder.save_cache()
        dm.embedder = encoder
    results: dict[str, Any] = {"data": dm.describe()}
    if cfg.get("train", True) and cfg.get("test", True):
        summary, predictions, per_fold = cross_validate(cfg, dm, encoder)
        tables = []
        for output, rows in summary.items():
            tables.append(f"### {output} ({dm.n_folds}-fold grouped CV, mean ± std over folds)\n\n{format_fold_table(rows)}\n")
        report = "\n".join(tables)
        print(f"\nText model vs baselines on {dm.name} ({len(dm.table)} rows, folds grouped by "
              f"{dm.spec.group_column or 'row'}):\n\n{report}")
        (out_dir / "text_metrics.md").write_text(report)
        (out_dir / "text_metrics.json").write_text(json.dumps({"summary": summary, "data": dm.describe()}, indent=1))
        pd.DataFrame(per_fold).to_csv(out_dir / "fold_metrics.csv", index=False)
        predictions.to_csv(out_dir / "oof_predictions.csv", index=False)
        results["cv"] = summary
    if cfg.model.get("final_fit", True) and cfg.get("train", True):
        dm.use_fold(None)
        settings = OmegaConf.to_container(cfg.model, resolve=True)
        module = fit_module(settings, dm, encoder, _trainer_kwargs(cfg), cfg.seed)
        bundle = save_bundle(out_dir / "model.pt", module, settings, dm.persona)
        results["model_path"] = str(bundle)
        print(f"final model (all rows): {bundle}")
        robust = cfg.model.get("robustness") or {}
        if robust.get("n_texts", 0):
            from src.text.robustness import robustness_table, write_report

            pick = np.sort(np.random.default_rng(cfg.seed).permutation(len(dm.table))[:robust["n_texts"]])
            fields = {f: [values[i] for i in pick] for f, values in dm.fields.items()}
            table = robustness_table(TextScorer(module, dm.persona, encoder), fields[dm.spec.fields[0]],
                                     tuple(robust.get("levels", (0.1, 0.3, 0.6))), cfg.seed, context=fields,
                                     persona=dm.table.iloc[pick][dm.spec.persona_columns].reset_index(drop=True))
            paths = write_report(table, out_dir, robust.get("report_level", 0.3))
            print(paths["md"].read_text())
            results["robustness"] = str(paths["md"])
    if encoder.frozen:
        encoder.save_cache()
    return results
