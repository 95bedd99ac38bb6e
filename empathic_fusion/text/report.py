"""The text-specific rows of the one test report (empathic_fusion/evaluation/report.py): every test
fold scores the model next to the baselines the project always reports, fitted on the same training
rows (TF-IDF + ridge, ridge on the frozen encoder's embeddings, the training mean), one row per
label and the overall mean, with macro-F1 and QWK on levels; the split-conformal intervals per output,
calibrated on the fold's validation rows (empathic_fusion/evaluation/conformal.py); plus the perturbation
report.

A text run is one fold of a grouped K-fold CV (`data.cv_fold`); `python train.py -m
experiment=text_empathetic_exchanges data.cv_fold=0,1,2,3,4` covers them all.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from empathic_fusion.core.sentence_encoder import SentenceEncoder
from empathic_fusion.evaluation.conformal import calibrate, interval_report
from empathic_fusion.evaluation.report import predict_loader
from empathic_fusion.metrics import metrics_with_levels
from empathic_fusion.models.base import EmpathyLightningModule
from empathic_fusion.text import baselines
from empathic_fusion.text.datamodule import TextDataModule

OVERALL = "overall"


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


def frozen_twin(module: EmpathyLightningModule) -> SentenceEncoder:
    """The frozen encoder (for the embedding baseline): the module's own, or the fine-tuned one's
    pretrained weights loaded afresh."""
    if module.frozen_encoder is not None:
        return module.frozen_encoder
    enc = dict(module.hparams.net["encoder"])
    enc.pop("_target_", None)
    return SentenceEncoder(**{**enc, "trainable_layers": 0})


def text_report_rows(module: EmpathyLightningModule, datamodule: TextDataModule, threshold_rating: float,
                     baselines_cfg: dict[str, Any]) -> dict[str, Any]:
    """The test fold's metrics per output (each label, and their mean as `overall`) for the model
    and the enabled baselines, with the rows' predictions, and the constant training mean's metrics on the
    main output (`constant`, also without baselines: the sanity check's). Acc/F1: above `threshold_rating`
    counts as empathized."""
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
    compare = {}
    if baselines_cfg["enabled"] and len(dm.train_rows):
        encoder = frozen_twin(module) if baselines_cfg["embedding_ridge"] else None
        compare = baseline_predictions(dm, encoder, baselines_cfg["ridge_alpha"])
    names = module.label_names
    title = module.title
    outputs = {name: {title: pred[:, j], **{b: p[:, j] for b, p in compare.items()}} for j, name in enumerate(names)}
    if len(names) > 1:
        outputs[OVERALL] = {title: pred.mean(1), **{b: p.mean(1) for b, p in compare.items()}}
    per_output = {name: {row: metrics_with_levels(p, target.mean(1) if name == OVERALL else target[:, names.index(name)],
                                                  threshold_rating, module.levels) for row, p in rows.items()}
                  for name, rows in outputs.items()}
    main = OVERALL if len(names) > 1 else names[0]
    frame = pd.DataFrame({"row_index": rows_idx, "participant_id": dm.groups(rows_idx), "fold": dm.fold,
                          "target": target.mean(1), "prediction": pred.mean(1)})
    for j, name in enumerate(names):
        frame[f"{name}_true"], frame[f"{name}_pred"] = target[:, j], pred[:, j]
    constant = per_output[main].get("training mean")
    if constant is None:  # baselines off: the same constant, for the sanity check (training rows, else the checkpoint's)
        fitted = np.concatenate([dm.train_rows, dm.val_rows])
        mean = (baselines.train_mean(dm.targets[fitted], len(rows_idx)) if len(fitted)
                else np.repeat(module.target_mean.cpu().numpy()[None, :], len(rows_idx), axis=0))
        constant = metrics_with_levels(mean.mean(1), frame["target"].to_numpy(), threshold_rating, module.levels)
    return {"main": main, "per_output": per_output, "baselines": list(compare), "predictions": frame,
            "constant": constant}


def validation_predictions(module: EmpathyLightningModule, datamodule: TextDataModule) -> tuple[np.ndarray, np.ndarray]:
    """Scores and labels (rows x labels) of the validation rows: the intervals' calibration items."""
    if not len(datamodule.val_rows):
        n_labels = len(module.label_names)
        return np.zeros((0, n_labels)), np.zeros((0, n_labels))
    predicted = predict_loader(module, datamodule.val_dataloader())
    return predicted["pred"].numpy(), predicted["target"].float().numpy()


def text_intervals(module: EmpathyLightningModule, datamodule: TextDataModule, coverage: float) -> dict[str, Any]:
    """Split-conformal intervals per label and overall, calibrated on the validation rows and checked on
    the test rows; with no validation rows (a table tested whole, `test_all`) every output has none."""
    dm = datamodule
    val_pred, val_target = validation_predictions(module, dm)
    test = module.test_predictions
    order = np.argsort(test["row"])
    test_pred, test_target = test["pred"][order], test["target"][order]
    names = list(module.label_names)
    columns = {name: j for j, name in enumerate(names)}
    if len(names) > 1:
        columns[OVERALL] = None
    pick = (lambda values, j: values.mean(1) if j is None else values[:, j])
    outputs = {name: calibrate(pick(val_pred, j), pick(val_target, j), pick(test_pred, j), pick(test_target, j),
                               coverage) for name, j in columns.items()}
    in_sample = bool(len(dm.val_rows)) and np.array_equal(np.sort(dm.val_rows), np.sort(dm.test_rows))
    report = interval_report(outputs, coverage, in_sample, "outputs")
    if not len(dm.val_rows):
        report["note"] = ("the data has no validation rows (a table tested whole): no interval; the intervals "
                          "of a checkpoint come from the test report of its training run")
    return report
