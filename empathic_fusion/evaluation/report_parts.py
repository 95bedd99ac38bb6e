"""What every test report is built from (report.py picks the model kind's report, fusion_report.py or
text_report.py, and each writes through these): `write_test_report` prints the table (the
model next to its baselines) and writes test_metrics.json / .md / .csv and test_predictions.csv, the files `evaluate.py sweep_dir=` reads.
Rating-level data (fusion windows averaged per self-rating) adds, through `build_report`, the
thresholds, per-participant breakdown, participant-bootstrap CIs and plots.

Participant ids stay in local files (test_predictions.csv, test_per_participant.csv and its PNG,
test_timelines/<session>.png: predicted empathy per window next to the self-ratings); only figures
without ids go to the attached loggers.
"""
from __future__ import annotations

import json
import logging
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from empathic_fusion.config import typed
from empathic_fusion.dataset.scale import RatingScale
from empathic_fusion.evaluation.participants import bootstrap_ci, per_participant
from empathic_fusion.evaluation.plots import (
    log_figure,
    per_participant_r,
    predicted_vs_true,
    rating_distributions,
    save_figure,
    session_timelines,
)
from empathic_fusion.metrics import METRIC_NAMES, choose_threshold, empathy_metrics, format_table, model_loss

log = logging.getLogger(__name__)
MSE_SCALE = "rating"  # test_metrics.json "mse_scale": MSE and MAE are on the rating (label) scale; reports before it
#                       held a fusion model's on the cosine scale (evaluation/card.py reads both)
NEARLY_CONSTANT = 0.25  # predictions whose sd is under this share of the ratings' sd are "nearly constant"


def settings(evaluation: dict[str, Any] | None) -> dict[str, Any]:
    """The evaluation settings with defaults filled in from their schema (empathic_fusion/config/evaluation.py);
    an unknown key, wrong type or value out of range is an error naming key=value."""
    return asdict(typed("evaluation", evaluation or {}))


def prediction_tables(predictions: dict[str, torch.Tensor], ratings: pd.DataFrame,
                      scale: RatingScale) -> dict[str, pd.DataFrame]:
    """Rating- and window-level predictions on the rating scale, each with session, participant and story."""
    who = ratings[["session_id", "participant_id", "story_id"]]
    window_counts = pd.Series(predictions["window_rating"].numpy()).value_counts()
    index = predictions["rating_index"].numpy()
    rating_table = pd.DataFrame({"rating_index": index}).join(who, on="rating_index")
    rating_table["n_windows"] = window_counts.reindex(index).to_numpy()
    rating_table["predicted"] = scale.to_rating(predictions["rating_pred"].numpy())
    rating_table["rated"] = scale.to_rating(predictions["rating_target"].numpy())
    window_index = predictions["window_rating"].numpy()
    window_table = pd.DataFrame({"rating_index": window_index}).join(who, on="rating_index")
    window_table["predicted"] = scale.to_rating(predictions["window_pred"].numpy())
    window_table["rated"] = scale.to_rating(predictions["window_target"].numpy())
    return {"rating": rating_table, "window": window_table}


def build_report(predictions: dict[str, torch.Tensor], ratings: pd.DataFrame, threshold: float, threshold_rating: float,
                 out_dir: Path, evaluation: dict[str, Any] | None = None,
                 val_predictions: dict[str, torch.Tensor] | None = None, loggers=(), *,
                 scale: RatingScale) -> dict[str, Any]:
    """Metrics per level (with the configured threshold), CIs, breakdown, files and plots under out_dir;
    tables, breakdown, plots and MSE on the data's rating `scale` (targets are ratings mapped onto [-1, 1];
    their MSE is each level's `loss`). Returns the results, thresholds, CIs, participant summary and the
    `prediction_tables` written."""
    cfg = settings(evaluation)
    if cfg["threshold"] == "validation" and val_predictions is None:
        raise ValueError("evaluation.threshold=validation needs the validation predictions")
    tables = prediction_tables(predictions, ratings, scale)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables["rating"].to_csv(out_dir / "test_predictions.csv", index=False)
    tables["window"].to_csv(out_dir / "test_window_predictions.csv", index=False)
    results, thresholds, ci = {}, {}, {}
    for level in ("window", "rating"):
        cut = None
        if cfg["threshold"] == "validation":
            cut = choose_threshold(val_predictions[f"{level}_pred"], val_predictions[f"{level}_target"], threshold)
        prediction_cut = threshold if cut is None else cut
        thresholds[level] = {"target": threshold, "prediction": prediction_cut,
                             "prediction_rating": float(scale.to_rating(prediction_cut)), "mode": cfg["threshold"]}
        results[level] = {**empathy_metrics(predictions[f"{level}_pred"], predictions[f"{level}_target"], threshold, cut,
                                            scale.half_range),
                          "loss": model_loss(predictions[f"{level}_pred"], predictions[f"{level}_target"])}
        if cfg["bootstrap"]:
            ci[level] = bootstrap_ci(tables[level], int(cfg["bootstrap"]), float(cfg["confidence"]),
                                     int(cfg["bootstrap_seed"]), threshold_rating, cut, scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        breakdown = per_participant(tables["rating"], threshold_rating, thresholds["rating"]["prediction"], scale)
    breakdown.to_csv(out_dir / "test_per_participant.csv", index=False)
    if cfg["plots"]:
        rating = tables["rating"]
        figures = {"test/predicted_vs_true": predicted_vs_true(rating["predicted"], rating["rated"],
                                                                "Test: predicted vs self-rated empathy (per rating)",
                                                                scale),
                   "test/rating_distributions": rating_distributions(rating["rated"], rating["predicted"],
                                                                     title="Test: self-rated vs predicted empathy",
                                                                     scale=scale)}
        for name, fig in figures.items():
            log_figure(loggers, name, fig)  # no participant ids in these two
            save_figure(fig, out_dir / f"{name.replace('/', '_')}.png")
        if len(breakdown):
            save_figure(per_participant_r(breakdown), out_dir / "test_per_participant_r.png")  # local only: ids
        session_timelines(tables["window"], out_dir / "test_timelines", scale)  # local only: session ids
    r_defined = breakdown.loc[breakdown["r_defined"], "pearson"] if len(breakdown) else pd.Series(dtype=float)
    participants = {"n": int(len(breakdown)), "n_r_defined": int(len(r_defined)),
                    "mean_r": float(r_defined.mean()) if len(r_defined) else float("nan"),
                    "median_r": float(np.median(r_defined)) if len(r_defined) else float("nan")}
    return {"results": results, "thresholds": thresholds, "ci": ci, "participants": participants, "tables": tables}


def format_ci(ci: dict[str, dict[str, dict[str, float]]], confidence: float,
              metrics: tuple[str, ...]) -> str:
    """Markdown (pandas + tabulate): estimate [low, high] per level and metric."""
    cells = pd.DataFrame({m: {level: f"{values[m]['estimate']:.3f} [{values[m]['low']:.3f}, {values[m]['high']:.3f}]"
                              for level, values in ci.items()} for m in metrics})
    table = cells.rename_axis("level").reset_index().to_markdown(index=False, colalign=["left"] * (len(metrics) + 1))
    return f"{confidence:.0%} bootstrap CI, resampling participants:\n\n" + table


def group_report(table: pd.DataFrame, threshold_rating: float, out_dir: Path, evaluation: dict[str, Any],
                 loggers=(), scale: RatingScale | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """Bootstrap CIs (resampling `participant_id`, a writer or conversation) and plots of a table of
    scores on their own label `scale` (`predicted`, `rated`), for models without rating windows (text);
    no plots when the scale is not known. Returns {"rating": CIs} or {} with `evaluation.bootstrap=0`."""
    cfg = settings(evaluation)
    ci = {}
    if cfg["bootstrap"]:
        ci["rating"] = bootstrap_ci(table, int(cfg["bootstrap"]), float(cfg["confidence"]), int(cfg["bootstrap_seed"]),
                                    threshold_rating, None, scale=None)
    if cfg["plots"] and scale is not None:
        figures = {"test/predicted_vs_true": predicted_vs_true(table["predicted"], table["rated"],
                                                                "Test: predicted vs annotated empathy", scale),
                   "test/rating_distributions": rating_distributions(table["rated"], table["predicted"],
                                                                     ("annotated", "predicted"),
                                                                     "Test: annotated vs predicted empathy", scale)}
        for name, fig in figures.items():
            log_figure(loggers, name, fig)  # scores only, no texts or ids
            save_figure(fig, out_dir / f"{name.replace('/', '_')}.png")
    return ci


def sanity_check(model: dict[str, float], constant: dict[str, float] | None, scale_name: str,
                 predicted: np.ndarray | None = None, rated: np.ndarray | None = None) -> dict[str, Any]:
    """Does the model beat the constant training mean at the rating level, on r (the constant's is 0) and on
    MSE (both on `scale_name`, e.g. "the 1-5 rating scale")? The numbers, and a sentence saying so in words
    when it does not (None when it does): a report, the model card and the app print it, so a model no better
    than guessing the mean is never read as a result. `constant`: the constant's metrics (None: MSE unchecked);
    `predicted`, `rated`: the rating-level scores, whose spread tells a nearly constant model."""
    r, mse = float(model["pearson"]), float(model["mse"])
    constant_mse = float(constant["mse"]) if constant and constant.get("mse") is not None else None
    failed = [] if r > 0 else [f"r {r:.3f} is not above the constant's 0"]
    if constant_mse is not None and not mse < constant_mse:
        failed.append(f"MSE {mse:.3f} is not below the constant's {constant_mse:.3f} ({scale_name})")
    spread = {}
    if predicted is not None and rated is not None and len(predicted) > 1:
        spread = {"prediction_sd": float(np.std(predicted, ddof=1)), "rating_sd": float(np.std(rated, ddof=1))}
    message = None
    if failed:
        message = ("Sanity check: the model does not beat the constant training mean at the rating level: "
                   + " and ".join(failed))
        if spread:
            nearly = "nearly constant" if spread["prediction_sd"] < NEARLY_CONSTANT * spread["rating_sd"] else "spread"
            message += (f"; its predictions are {nearly} (sd {spread['prediction_sd']:.2f} against the ratings' "
                        f"{spread['rating_sd']:.2f})")
        message += ". Read its other numbers as no better than predicting the mean."
    return {"beats_constant_mean": not failed, "r": r, "mse": mse, "constant_mse": constant_mse,
            "scale": scale_name, **spread, "message": message}


def write_test_report(out_dir: Path, heading: str, rows: dict[str, dict[str, float]], summary: dict[str, Any],
                      predictions: pd.DataFrame | None = None, metrics: tuple[str, ...] = METRIC_NAMES,
                      notes: str = "", loggers=(), logged: dict[str, float] | None = None,
                      sanity: dict[str, Any] | None = None) -> dict[str, Any]:
    """Print `heading` and the table of `rows` (model and baselines, one per row), then write
    test_metrics.json (`summary`: "model" holds the model's metrics per level, "sanity" the `sanity_check`),
    test_metrics.md (the heading, which names the scales, the sanity sentence when the model does not beat
    the constant mean, the table and `notes`, e.g. the CI table), test_metrics.csv (one line per row) and,
    when given, test_predictions.csv. The sanity sentence is also logged as a warning. `logged` numbers go to
    the loggers (never texts or ids)."""
    table = format_table(rows, metrics=metrics)
    warning = (sanity or {}).get("message")
    if sanity is not None:
        summary["sanity"] = sanity
    summary["mse_scale"] = MSE_SCALE
    body = "\n\n".join(filter(None, [f"{heading}:", warning, table, notes]))
    print(f"\n{body}\n")
    if warning:
        log.warning("%s", warning)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "test_metrics.json").write_text(json.dumps(summary, indent=1))
    (out_dir / "test_metrics.md").write_text(body + "\n")
    pd.DataFrame([{"row": name, **values} for name, values in rows.items()]).to_csv(out_dir / "test_metrics.csv",
                                                                                    index=False)
    if predictions is not None:
        predictions.to_csv(out_dir / "test_predictions.csv", index=False)
    if logged:
        for logger in loggers:
            logger.log_metrics(logged)
    return summary
