"""Empathy metrics as in the paper: Pearson r, Spearman rho, accuracy, binary F1, MSE; plus MAE and
Lin's concordance correlation (CCC), which penalises a model that ranks well but is off in scale.

A fusion model's scores live on the cosine scale (rating - midpoint) / half-range of the data's rating
scale (dataset/scale.py; (rating - 3) / 2 on the default 1-5), and its metrics are computed there; MSE and
MAE are reported on the rating scale all the same (`half_range`: x half-range² and x half-range), so there
is one MSE wherever it is shown: the model-scale MSE is its training objective and is reported only as
`loss` (`model_loss`). r, rho, Acc, F1 and CCC do not depend on the scale. Accuracy and F1 binarise the
truth at a rating threshold mapped onto that scale (default the midpoint: on 1-5 a rating above 3 counts
as "empathized") and the prediction at the same threshold, or at a cutoff chosen on the validation split
(`choose_threshold`), never on test.
Window-level metrics score every window; rating-level metrics first average the windows of each
rating. On an integer scale (text labels, 1-5 levels) `level_metrics` adds macro-F1 and quadratic
weighted kappa on levels: a continuous prediction becomes a level by rounding and clipping.

Degenerate inputs give a warning and a defined value, never a crash or a silent NaN: a correlation
of a constant (or of fewer than 2 items) is 0, F1 with no positive prediction or truth is 0, and a
split with a single class still gets its accuracy. Only an empty input gives NaN (nothing to score).
"""
from __future__ import annotations

import warnings

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from sklearn.metrics import cohen_kappa_score, f1_score

if TYPE_CHECKING:  # torch is imported where a function needs it: tables and sweeps load without it
    import torch

METRIC_NAMES = ("pearson", "spearman", "accuracy", "f1", "mse")  # the paper's five, in its column order
EXTRA_METRIC_NAMES = ("mae", "ccc")
ALL_METRIC_NAMES = METRIC_NAMES + EXTRA_METRIC_NAMES
LEVEL_METRIC_NAMES = ("macro_f1", "qwk")  # on integer levels (level_metrics)
PAPER_SYMBOLS = {"pearson": "r", "spearman": "rho", "accuracy": "Acc", "f1": "F1", "mse": "MSE",
                 "mae": "MAE", "ccc": "CCC", "macro_f1": "macro-F1", "qwk": "QWK"}
LOWER_IS_BETTER = frozenset({"mse", "mae"})


def _as_float64(values) -> np.ndarray:
    """A flat float64 array of a tensor (on any device) or of anything numpy reads."""
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().flatten().double().cpu().numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)


def _warn_degenerate(pred: np.ndarray, target: np.ndarray, true_class: np.ndarray) -> None:
    """Say which metrics fall back to their defined values (see the module docstring)."""
    if len(pred) < 2 or np.ptp(pred) == 0 or np.ptp(target) == 0:
        for name in ("pearson", "spearman"):
            warnings.warn(f"{name}: constant predictions or targets (or fewer than 2 items); reported as 0", stacklevel=3)
        if len(pred) < 2:
            warnings.warn("ccc: fewer than 2 items; reported as 0", stacklevel=3)
        else:
            same = bool(np.array_equal(pred, target))
            warnings.warn(f"ccc: constant predictions or targets; reported as {int(same)}", stacklevel=3)
    if true_class.min() == true_class.max():
        warnings.warn(f"accuracy/f1: every target is on one side of the threshold ({'above' if true_class[0] else 'at or below'}); "
                      "F1 is 0 without positives", stacklevel=3)


def metric_values(pred: np.ndarray, target: np.ndarray, threshold: float = 0.0,
                  pred_threshold: float | None = None, half_range: float = 1.0) -> dict[str, float]:
    """Every metric in ALL_METRIC_NAMES for two non-empty 1-D float arrays, without checks or warnings:
    the core that `empathy_metrics`, the participant bootstrap (thousands of resamples) and the text
    metrics share. `half_range`: the rating scale's half-range when the arrays are on the cosine scale,
    so that MSE and MAE come out on the rating scale (1: they are on it already, e.g. text labels).
    Degenerate cases take the defined values of the module docstring. Written in numpy
    rather than called per metric from scipy / scikit-learn / torchmetrics: one pass without their
    input validation keeps the bootstrap fast, and their NaN for a constant's r would need patching;
    tests/test_metrics.py checks every value against those libraries."""
    pred_class = pred > (threshold if pred_threshold is None else pred_threshold)
    true_class = target > threshold
    tp = float((pred_class & true_class).sum())
    positives = float(pred_class.sum() + true_class.sum())
    if len(pred) < 2 or np.ptp(pred) == 0 or np.ptp(target) == 0:
        pearson = spearman = 0.0
        ccc = float(np.array_equal(pred, target)) if len(pred) >= 2 else 0.0
    else:
        pearson = float(np.corrcoef(pred, target)[0, 1])
        spearman = float(np.corrcoef(rankdata(pred), rankdata(target))[0, 1])  # ties get average ranks
        cov = np.cov(pred, target, ddof=1)
        ccc = float(2 * cov[0, 1] / (cov[0, 0] + cov[1, 1] + (pred.mean() - target.mean()) ** 2))
    return {"pearson": pearson, "spearman": spearman, "accuracy": float((pred_class == true_class).mean()),
            "f1": 2 * tp / positives if positives else 0.0,
            "mse": float(np.mean((pred - target) ** 2)) * half_range ** 2,
            "mae": float(np.mean(np.abs(pred - target))) * half_range, "ccc": ccc}


def model_loss(pred: torch.Tensor | np.ndarray, target: torch.Tensor | np.ndarray) -> float:
    """MSE on the scale the model predicts (a fusion model's cosine scale): its training objective, reported
    as `loss` beside the rating-scale metrics (`{stage}/loss` is the same quantity per batch)."""
    pred, target = _as_float64(pred), _as_float64(target)
    return float(np.mean((pred - target) ** 2)) if len(pred) else float("nan")


def empathy_metrics(pred: torch.Tensor, target: torch.Tensor, threshold: float = 0.0,
                    pred_threshold: float | None = None, half_range: float = 1.0) -> dict[str, float]:
    """Every metric in ALL_METRIC_NAMES for 1-D predictions and targets on the cosine scale, MSE and MAE
    on the rating scale of `half_range` (`metric_values`).

    `threshold` binarises the truth (and the prediction unless `pred_threshold` is given, e.g. a
    cutoff chosen on validation with `choose_threshold`). Degenerate cases are warned about.
    """
    pred = _as_float64(pred)
    target = _as_float64(target)
    if len(pred) != len(target):
        raise ValueError(f"predictions and targets differ in length: {len(pred)} vs {len(target)}")
    if len(pred) == 0:
        return {name: float("nan") for name in ALL_METRIC_NAMES}
    if not (np.isfinite(pred).all() and np.isfinite(target).all()):
        raise ValueError("predictions and targets must be finite (mask missing values before scoring)")
    _warn_degenerate(pred, target, target > threshold)
    return metric_values(pred, target, threshold, pred_threshold, half_range)


def to_levels(values: np.ndarray, levels: tuple[int, int]) -> np.ndarray:
    """Round to the nearest integer level inside [low, high]."""
    low, high = levels
    return np.clip(np.rint(np.asarray(values, dtype=float)), low, high).astype(int)


def infer_levels(values: np.ndarray) -> tuple[int, int] | None:
    """(min, max) when every label is an integer, else None (no level metrics)."""
    values = np.asarray(values, dtype=float)
    if len(values) and np.allclose(values, np.rint(values)):
        return int(values.min()), int(values.max())
    return None


def level_metrics(pred: np.ndarray, target: np.ndarray, levels: tuple[int, int] | None) -> dict[str, float]:
    """Macro-F1 over the scale's levels and quadratic weighted kappa (scikit-learn) of the rounded and
    clipped predictions; NaN without an integer scale or without items. Agreement of two constants is 0."""
    pred, target = np.asarray(pred, dtype=float).ravel(), np.asarray(target, dtype=float).ravel()
    if len(pred) != len(target):
        raise ValueError(f"{len(pred)} predictions for {len(target)} targets")
    if levels is None or len(pred) == 0:
        return {name: float("nan") for name in LEVEL_METRIC_NAMES}
    p, t = to_levels(pred, levels), to_levels(target, levels)
    labels = list(range(levels[0], levels[1] + 1))
    qwk = 0.0 if len(np.unique(p)) == 1 and len(np.unique(t)) == 1 else \
        float(np.nan_to_num(cohen_kappa_score(t, p, labels=labels, weights="quadratic")))
    return {"macro_f1": float(f1_score(t, p, labels=labels, average="macro", zero_division=0)), "qwk": qwk}


def metrics_with_levels(pred: np.ndarray, target: np.ndarray, threshold: float,
                        levels: tuple[int, int] | None) -> dict[str, float]:
    """`metric_values` (Acc/F1: above `threshold` counts as empathized) plus `level_metrics`: the row
    of a model scored on its own label scale (text labels)."""
    values = metric_values(np.asarray(pred, dtype=float), np.asarray(target, dtype=float), threshold)
    return {**values, **level_metrics(pred, target, levels)}


def choose_threshold(val_pred: torch.Tensor, val_target: torch.Tensor, threshold: float = 0.0) -> float:
    """The prediction cutoff that maximises F1 (then accuracy) on validation; truth stays cut at `threshold`.

    Use the returned value as `pred_threshold` on test. Falls back to `threshold` (with a warning)
    when validation has one class only.
    """
    pred = _as_float64(val_pred)
    truth = _as_float64(val_target) > threshold
    if len(pred) == 0 or truth.all() or not truth.any():
        warnings.warn("choose_threshold: validation has a single class; keeping the fixed threshold", stacklevel=2)
        return float(threshold)
    values = np.unique(pred)
    candidates = np.concatenate([[values[0] - 1e-6], (values[:-1] + values[1:]) / 2, [values[-1] + 1e-6]])
    best, best_key = float(threshold), (-1.0, -1.0)
    for cut in candidates:
        predicted = pred > cut
        tp = float((predicted & truth).sum())
        f1 = 2 * tp / (predicted.sum() + truth.sum()) if predicted.sum() + truth.sum() else 0.0
        key = (f1, float((predicted == truth).mean()))
        if key > best_key:
            best, best_key = float(cut), key
    return best


def aggregate_by_rating(pred: torch.Tensor, target: torch.Tensor,
                        rating_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean prediction over each rating's windows, with that rating's target and index."""
    import torch

    ids, inverse = torch.unique(rating_index, return_inverse=True)
    counts = torch.zeros(len(ids)).index_add_(0, inverse, torch.ones(len(inverse)))
    mean_pred = torch.zeros(len(ids)).index_add_(0, inverse, pred.float()) / counts
    first_target = torch.zeros(len(ids)).index_copy_(0, inverse, target.float())
    return mean_pred, first_target, ids


def split_predictions(pred: torch.Tensor, target: torch.Tensor, rating_index: torch.Tensor) -> dict[str, torch.Tensor]:
    """A split's window predictions with their targets and ratings, and the per-rating means (what the reports
    and the rating-level metrics read)."""
    rating_pred, rating_target, ids = aggregate_by_rating(pred, target, rating_index)
    return {"window_pred": pred, "window_target": target, "window_rating": rating_index,
            "rating_pred": rating_pred, "rating_target": rating_target, "rating_index": ids}


def format_table(rows: dict[str, dict[str, float]], scale: float = 1.0,
                 metrics: tuple[str, ...] = METRIC_NAMES) -> str:
    """Markdown table (pandas + tabulate) with the paper's column symbols; scale=100 gives the paper's x100 display."""
    frame = pd.DataFrame.from_dict(rows, orient="index")[list(metrics)] * scale
    return frame.rename(columns=PAPER_SYMBOLS).to_markdown(floatfmt=".3f", missingval="nan")
