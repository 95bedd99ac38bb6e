"""The test report of a text model: every test fold scores the model next to the baselines the
project always reports, fitted on the same training rows (TF-IDF + ridge, ridge on the frozen encoder's
embeddings, the training mean), one row per label and the overall mean, with macro-F1 and QWK on levels;
the split-conformal intervals per output, calibrated on the fold's validation rows
(empathic_fusion/evaluation/conformal.py); plus the perturbation report. Written through the one report
of empathic_fusion/evaluation/report_parts.py.

A text run is one fold of a grouped K-fold CV (`data.cv_fold`); `python train.py -m
experiment=text_empathetic_exchanges data.cv_fold=0,1,2,3,4` covers them all.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from empathic_fusion.config.data import text_rating_scale
from empathic_fusion.config.evaluation import threshold_rating_on
from empathic_fusion.core.sentence_encoder import SentenceEncoder
from empathic_fusion.datamodules.text_datamodule import TextDataModule
from empathic_fusion.dataset.scale import RatingScale
from empathic_fusion.evaluation.conformal import calibrate, format_intervals, interval_report
from empathic_fusion.evaluation.groups import check_groups, group_results
from empathic_fusion.evaluation.report_parts import format_ci, group_report, sanity_check, settings, write_test_report
from empathic_fusion.evaluation.text_robustness import robustness_report
from empathic_fusion.metrics import LEVEL_METRIC_NAMES, METRIC_NAMES, metrics_with_levels
from empathic_fusion.models.predict import predict_batches
from empathic_fusion.models.text_module import OVERALL, TextEmpathyModule
from empathic_fusion.evaluation import text_baselines as baselines


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


def text_report_rows(module: TextEmpathyModule, datamodule: TextDataModule, threshold_rating: float,
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


def validation_predictions(module: TextEmpathyModule, datamodule: TextDataModule) -> tuple[np.ndarray, np.ndarray]:
    """Scores and labels (rows x labels) of the validation rows: the intervals' calibration items."""
    if not len(datamodule.val_rows):
        n_labels = len(module.label_names)
        return np.zeros((0, n_labels)), np.zeros((0, n_labels))
    predicted = predict_batches(module, datamodule.val_dataloader(), ("target",))
    return predicted["pred"].numpy(), predicted["target"].float().numpy()


def text_intervals(module: TextEmpathyModule, datamodule: TextDataModule, coverage: float) -> dict[str, Any]:
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


def text_report(module: TextEmpathyModule, datamodule: TextDataModule, out_dir: Path, evaluation: dict[str, Any],
                loggers: list | tuple = ()) -> dict[str, Any]:
    """The test fold's report: model and baselines per label (`outputs`) and overall (`model`,
    `baselines`), macro-F1 and QWK on levels, bootstrap CIs resampling the groups (writers,
    conversations) and plots of the overall score, the experts' stack, the data; the
    perturbation report when `robustness.n_texts` > 0."""
    config = settings(evaluation)
    if config["threshold"] != "fixed":
        raise ValueError(f"evaluation.threshold={config['threshold']}: a text model's report cuts Acc/F1 at "
                         "evaluation.threshold_rating (evaluation.threshold=fixed)")
    levels = module.run_config["data"].get("levels")
    threshold_rating = threshold_rating_on(text_rating_scale(levels), config["threshold_rating"],
                                           "data.levels" if levels else "the default 1-5 scale")
    check_groups(module, datamodule, config)  # before the baselines and the bootstrap
    rows = text_report_rows(module, datamodule, threshold_rating, module.hparams.baselines)
    main, per_output = rows["main"], rows["per_output"]
    baseline_results = {b: {"rating": per_output[main][b]} for b in rows["baselines"]}
    frame = rows["predictions"]
    # the plots' axes are the labels' levels (configured or inferred); none without them
    scale = RatingScale(*map(float, module.levels)) if module.levels and module.levels[0] < module.levels[1] else None
    ci = group_report(frame[["participant_id"]].assign(predicted=frame["prediction"], rated=frame["target"]),
                      threshold_rating, out_dir, config, loggers, scale)
    summary = {"model": {"rating": per_output[main][module.title]}, "baselines": baseline_results,
               "constant_baseline": baseline_results.get("training mean", {}), "outputs": per_output,
               "ci": ci, "confidence": float(config["confidence"]), "stack": module.stack_report,
               "data": datamodule.describe(),
               "intervals": text_intervals(module, datamodule, float(config["interval_coverage"]))}
    dm = datamodule
    scale_name = f"the labels' {scale} scale" if scale is not None else "the labels' scale"
    heading = (f"Test metrics ({dm.name}, fold {dm.fold} of {dm.n_folds}, {len(dm.test_rows)} rows, {main}; "
               f"Acc/F1: above {threshold_rating:g} counts as empathized; MSE on {scale_name})")
    logged = {f"test_baseline/{b.replace(' ', '_')}/{m}": v for b, res in baseline_results.items()
              for m, v in res["rating"].items()}
    notes = format_ci(ci, float(config["confidence"]), METRIC_NAMES) if ci else ""
    notes = "\n\n".join(filter(None, [notes, format_intervals(summary["intervals"])]))
    if config["groups"]:
        attributes = datamodule.table[config["groups"]].iloc[frame["row_index"]].set_index(frame.index)
        summary["groups"], group_table = group_results(
            frame[["participant_id"]].assign(predicted=frame["prediction"], rated=frame["target"]), attributes,
            config, None, out_dir, scale_name, loggers)
        notes = "\n\n".join(filter(None, (notes, group_table)))
    sanity = sanity_check(per_output[main][module.title], rows["constant"], scale_name,
                          frame["prediction"].to_numpy(float), frame["target"].to_numpy(float))
    write_test_report(out_dir, heading, per_output[main], summary, frame, METRIC_NAMES + LEVEL_METRIC_NAMES,
                      notes=notes, loggers=loggers, logged=logged, sanity=sanity)
    robust = robustness_report(module, datamodule, module.hparams.robustness, int(module.run_config["seed"]), out_dir)
    if robust is not None:
        summary["robustness"] = str(robust)
    return summary


