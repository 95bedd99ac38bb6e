"""The test report of a fusion model: per window and per rating next to the constant training mean, with
the thresholds, participant-bootstrap CIs, conformal intervals, group breakdowns and the missing-modality
passes, written through the one report of empathic_fusion/evaluation/report_parts.py."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from empathic_fusion.datamodules.protocol import FusionData
from empathic_fusion.evaluation.conformal import format_intervals, fusion_intervals
from empathic_fusion.evaluation.groups import check_groups, group_results
from empathic_fusion.evaluation.missing_modalities import missing_modality_report
from empathic_fusion.evaluation.report_parts import build_report, format_ci, sanity_check, settings, write_test_report
from empathic_fusion.metrics import METRIC_NAMES, empathy_metrics, model_loss
from empathic_fusion.models.fusion_module import FusionModule
from empathic_fusion.models.predict import predict_split


def fusion_report(module: FusionModule, datamodule: FusionData, out_dir: Path, evaluation: dict[str, Any],
                  loggers: list | tuple = ()) -> dict[str, Any]:
    """Per window and per rating, next to the train-mean constant baseline; predictions with
    session, participant and story, the per-participant breakdown, bootstrap CIs and plots.

    `evaluation` (conf/evaluation) sets the Acc/F1 threshold (`threshold_rating`; mode `fixed`,
    or `validation`: the prediction cutoff that maximises F1 on the validation split), the
    participant resamples for the CIs and whether to draw plots (empathic_fusion/evaluation/report_parts.py).
    """
    config = settings(evaluation)
    scale = module.rating_scale
    threshold_rating = module.threshold_rating(config)
    threshold = float(scale.to_target(threshold_rating))
    predictions = module.test_predictions
    check_groups(module, datamodule, config)  # before the bootstrap
    # threshold and interval calibration: saved with the checkpoint by its weights, or a pass over the split
    val_predictions = module.validation_predictions(datamodule) or predict_split(module, datamodule.val_dataloader())
    report = build_report(predictions, datamodule.ratings, threshold, threshold_rating, out_dir, config,
                          val_predictions, loggers, scale=scale)
    results = report["results"]
    with warnings.catch_warnings():  # a constant's correlation is undefined; reported as 0 by design
        warnings.simplefilter("ignore")
        constant = {level: torch.full_like(predictions[f"{level}_target"], datamodule.train_target_mean)
                    for level in ("window", "rating")}
        baseline = {level: {**empathy_metrics(constant[level], predictions[f"{level}_target"], threshold,
                                              half_range=scale.half_range),
                            "loss": model_loss(constant[level], predictions[f"{level}_target"])}
                    for level in ("window", "rating")}
    rows = {f"{module.title} (per window)": results["window"], f"{module.title} (per rating)": results["rating"],
            "constant train mean (per window)": baseline["window"],
            "constant train mean (per rating)": baseline["rating"]}
    ci_table = format_ci(report["ci"], float(config["confidence"]), METRIC_NAMES) if report["ci"] else ""
    datasets = datamodule.datasets
    in_sample = datasets.get("test") is datasets.get("val")  # evaluate.py split=val
    intervals = fusion_intervals(predictions, val_predictions, scale.to_rating, float(config["interval_coverage"]),
                                 in_sample)
    summary = {"model": results, "constant_baseline": baseline, "thresholds": report["thresholds"],
               "ci": report["ci"], "confidence": float(config["confidence"]), "participants": report["participants"],
               "intervals": intervals}
    notes = "\n\n".join(filter(None, [ci_table, format_intervals(intervals)]))
    if config["groups"]:
        rated = report["tables"]["rating"]
        attributes = datamodule.dataset.participants[config["groups"]].reindex(rated["participant_id"])
        summary["groups"], group_table = group_results(rated, attributes.set_index(rated.index), config,
                                                       scale, out_dir, f"the {scale} rating scale", loggers)
        notes = "\n\n".join(filter(None, (notes, group_table)))
    if config["missing_modalities"]:  # the test split again with modalities removed and frames dropped
        missing = missing_modality_report(module, datamodule.test_dataloader(), module.modalities, out_dir, config,
                                          loggers, scale.half_range)
        summary["missing_modalities"] = missing["summary"]
        notes = "\n\n".join(filter(None, (notes, missing["table"])))
    heading = (f"Test metrics ({datamodule.scenario}, modalities {'+'.join(datamodule.modalities)}; "
               f"ratings {scale}, Acc/F1: above {threshold_rating:g} counts as empathized; "
               f"MSE on the {scale} rating scale; the training loss, MSE on the model's scale "
               f"(rating-{scale.midpoint:g})/{scale.half_range:g}, is `loss` in test_metrics.json)")
    rated = report["tables"]["rating"]
    sanity = sanity_check(results["rating"], baseline["rating"], f"the {scale} rating scale",
                          rated["predicted"].to_numpy(float), rated["rated"].to_numpy(float))
    return write_test_report(out_dir, heading, rows, summary, notes=notes, sanity=sanity)
