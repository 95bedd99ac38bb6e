"""The text side of empathic_fusion/pipeline.py's one `train()` / `evaluate()`: build a text run from config,
and report its test fold in the fusion format (so `evaluate.py sweep_dir=` builds the same tables).

A text run is one fold of a grouped K-fold CV (`data.cv_fold`); `python train.py -m
experiment=text_empathetic_exchanges data.cv_fold=0,1,2,3,4` covers them all. Every fold's report
scores the model next to the baselines the project always reports, fitted on the same training
rows: TF-IDF + ridge, ridge on the frozen encoder's embeddings and the training mean.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf

from empathic_fusion.metrics import LEVEL_METRIC_NAMES, METRIC_NAMES, format_table, metrics_with_levels
from empathic_fusion.text import baselines
from empathic_fusion.text.data import PersonaEncoder
from empathic_fusion.text.datamodule import TextDataModule
from empathic_fusion.text.encoder import SentenceEncoder
from empathic_fusion.text.model import OVERALL, TextEmpathyModule

log = logging.getLogger(__name__)
REPORT_METRICS = METRIC_NAMES + LEVEL_METRIC_NAMES


def is_text_config(data_cfg: dict | DictConfig) -> bool:
    """A data config whose datamodule is the text table one."""
    target = str((data_cfg or {}).get("_target_", ""))
    return target.endswith("TextDataModule")


def build_text_datamodule(data_cfg: dict) -> TextDataModule:
    return hydra.utils.instantiate(data_cfg, _convert_="all")


def build_text_module(cfg: DictConfig, datamodule: TextDataModule) -> TextEmpathyModule:
    """The model from `cfg.model` (`net`, `optimizer`, `scheduler`, ...) and the fold's fitted data state;
    a frozen encoder is attached to the datamodule, which then serves cached embeddings."""
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    run_config = {"data": OmegaConf.to_container(cfg.data, resolve=True), "model": model_cfg}
    module = TextEmpathyModule(net=model_cfg["net"], data_info=datamodule.fitted_state(),
                               optimizer=model_cfg["optimizer"], scheduler=model_cfg.get("scheduler"),
                               encoder_lr=model_cfg.get("encoder_lr", 2.0e-5), use_persona=model_cfg.get("use_persona", True),
                               run_config=run_config)
    attach_encoder(module, datamodule)
    return module


def attach_encoder(module: TextEmpathyModule, datamodule: TextDataModule) -> None:
    """Frozen encoder: encode every text of the table once (cached on disk when cache_dir is set)."""
    encoder = module.frozen_encoder
    datamodule.embedder = encoder
    module.encoder.check_languages(datamodule.fields)
    if encoder is not None:
        encoder.warm(datamodule.all_texts())
        encoder.save_cache()


def baseline_predictions(datamodule: TextDataModule, encoder: SentenceEncoder | None, alpha: float | None) -> dict[str, np.ndarray]:
    """The reported baselines on the test rows, fitted on this fold's training (+ validation) rows."""
    dm = datamodule
    test, train, val = dm.test_rows, dm.train_rows, dm.val_rows
    rows = {"TF-IDF + ridge": baselines.tfidf_ridge(dm.fields, dm.targets, train, test, alpha, val)}
    if encoder is not None:
        embeddings = torch.cat([encoder(dm.fields[f]) for f in dm.spec.fields], dim=-1).float().cpu().numpy()
        rows["ridge on frozen embeddings"] = baselines.embedding_ridge(embeddings, dm.targets, train, test, val)
    rows["training mean"] = baselines.train_mean(dm.targets[np.concatenate([train, val])], len(test))
    return rows


def frozen_twin(module: TextEmpathyModule) -> SentenceEncoder:
    """The frozen encoder (for the embedding baseline): the module's own, or the fine-tuned one's
    pretrained weights loaded afresh."""
    if module.frozen_encoder is not None:
        return module.frozen_encoder
    enc = dict(module.hparams.net["encoder"])
    enc.pop("_target_", None)
    return SentenceEncoder(**{**enc, "trainable_layers": 0})


def report_text_test(module: TextEmpathyModule, datamodule: TextDataModule, out_dir: Path, title: str,
                     loggers: list | tuple = (), threshold_rating: float = 3.0,
                     baselines_cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """Print and write the test fold's metrics, model and baselines, in the fusion format:
    `test_metrics.json` ({"model": {"rating": ...}, "baselines": {name: {"rating": ...}}, per-label
    rows under "outputs"), `test_metrics.md/.csv` and `test_predictions.csv` (group as participant_id,
    so the CV coverage check of sweep tables applies). Loggers get the numbers, never the texts."""
    predictions = module.test_predictions
    if not predictions:
        raise RuntimeError("no test predictions: run trainer.test first (and give the datamodule test rows)")
    dm = datamodule
    order = np.argsort(predictions["row"])
    rows_idx = predictions["row"][order]
    if not np.array_equal(rows_idx, np.sort(dm.test_rows)):
        raise RuntimeError(f"test predictions cover {len(rows_idx)} rows, the fold has {len(dm.test_rows)}")
    pred, target = predictions["pred"][order], predictions["target"][order]
    dm.test_rows = rows_idx
    baselines_cfg = baselines_cfg or {}
    compare = {}
    if baselines_cfg.get("enabled", True) and len(dm.train_rows):
        encoder = frozen_twin(module) if baselines_cfg.get("embedding_ridge", True) else None
        compare = baseline_predictions(dm, encoder, baselines_cfg.get("ridge_alpha"))
    names = module.label_names
    outputs = {name: {title: pred[:, j], **{b: p[:, j] for b, p in compare.items()}} for j, name in enumerate(names)}
    if len(names) > 1:
        outputs[OVERALL] = {title: pred.mean(1), **{b: p.mean(1) for b, p in compare.items()}}
    overall_target = target.mean(1)
    levels = module.levels
    per_output = {name: {row: metrics_with_levels(p, target.mean(1) if name == OVERALL else target[:, names.index(name)],
                                              threshold_rating, levels) for row, p in rows.items()}
                  for name, rows in outputs.items()}
    main = OVERALL if len(names) > 1 else names[0]
    results = {"rating": per_output[main][title]}
    baseline_results = {b: {"rating": per_output[main][b]} for b in compare}
    table = format_table(per_output[main], metrics=REPORT_METRICS)
    print(f"\nTest metrics ({dm.name}, fold {dm.fold} of {dm.n_folds}, {len(rows_idx)} rows, {main}; "
          f"Acc/F1: above {threshold_rating:g} counts as empathized):\n{table}\n")
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {"model": results, "baselines": baseline_results,
               "constant_baseline": baseline_results.get("training mean", {}), "outputs": per_output,
               "stack": module.stack_report, "data": dm.describe()}
    (out_dir / "test_metrics.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "test_metrics.md").write_text(table + "\n")
    pd.DataFrame([{"row": row, **values} for row, values in per_output[main].items()]).to_csv(
        out_dir / "test_metrics.csv", index=False)
    frame = pd.DataFrame({"row_index": rows_idx, "participant_id": dm.groups(rows_idx), "fold": dm.fold,
                          "target": overall_target, "prediction": pred.mean(1)})
    for j, name in enumerate(names):
        frame[f"{name}_true"], frame[f"{name}_pred"] = target[:, j], pred[:, j]
    frame.to_csv(out_dir / "test_predictions.csv", index=False)
    flat = {f"test_baseline/{b.replace(' ', '_')}/{m}": v for b, res in baseline_results.items()
            for m, v in res["rating"].items()}
    for logger in loggers:
        logger.log_metrics(flat)
    return summary


def robustness_report(checkpoint: str | Path, datamodule: TextDataModule, settings: dict[str, Any], seed: int,
                      out_dir: Path) -> Path | None:
    """The perturbation report of a saved checkpoint on (up to n_texts of) the test fold's texts."""
    n_texts = int((settings or {}).get("n_texts", 0) or 0)
    if not n_texts or not len(datamodule.test_rows) or not checkpoint:
        return None
    from empathic_fusion.text.robustness import robustness_table, write_report
    from empathic_fusion.text.scorer import TextScorer

    dm = datamodule
    scorer = TextScorer.load(checkpoint)
    pick = np.sort(np.random.default_rng(seed).permutation(dm.test_rows)[:n_texts])
    fields = {f: [values[i] for i in pick] for f, values in dm.fields.items()}
    table = robustness_table(scorer, fields[dm.spec.fields[0]], tuple(settings.get("levels", (0.1, 0.3, 0.6))), seed,
                             context=fields, persona=dm.table.iloc[pick][dm.spec.persona_columns].reset_index(drop=True))
    paths = write_report(table, out_dir, settings.get("report_level", 0.3))
    print(paths["md"].read_text())
    return paths["md"]


def load_text_checkpoint(path: str | Path, data_overrides: dict[str, Any], test_csv: str | None = None
                         ) -> tuple[TextEmpathyModule, TextDataModule]:
    """A text checkpoint and the datamodule to score it on: its own test fold, or every row of
    `test_csv` (same column names) with the checkpoint's persona vocabulary and target scaling."""
    module = TextEmpathyModule.load_from_checkpoint(path, map_location="cpu", weights_only=False)
    data_cfg = {**module.hparams.run_config["data"], **(data_overrides or {})}
    if test_csv:
        data_cfg.update(path=str(test_csv), test_all=True, cv_fold=None, max_rows=None)
    dm = build_text_datamodule(data_cfg)
    dm.setup("test")
    info = module.hparams.data_info  # the checkpoint's persona vocabulary and scaling, never refitted
    dm.apply_fitted(PersonaEncoder.from_state(info["persona"]), np.asarray(info["target_mean"]),
                    np.asarray(info["target_std"]))
    missing = [f for f in info["fields"] if f not in dm.fields]
    if missing:
        raise ValueError(f"{path}: the model reads fields {info['fields']}, the data has {list(dm.fields)}")
    attach_encoder(module, dm)
    return module, dm
