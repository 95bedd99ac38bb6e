"""Metrics for text scores: correlation, error and, on integer scales, level agreement.

Levels (the Sense-7 dataset paper: per-turn empathy on 5 levels): a continuous prediction becomes a level by rounding and clipping to the
scale; accuracy, macro-F1 (over the scale's levels) and quadratic weighted kappa compare levels.
A constant prediction has no correlation: it is reported as 0 (the project's convention).
"""
from __future__ import annotations

import numpy as np
from sklearn.metrics import accuracy_score, cohen_kappa_score, f1_score

from empathic_fusion.metrics import metric_values

TEXT_METRICS = ("pearson", "spearman", "mse", "accuracy", "macro_f1", "qwk")
SYMBOLS = {"pearson": "r", "spearman": "rho", "mse": "MSE", "accuracy": "Acc", "macro_f1": "macro-F1", "qwk": "QWK"}


def to_levels(values: np.ndarray, levels: tuple[int, int]) -> np.ndarray:
    """Round to the nearest integer level inside [low, high]."""
    low, high = levels
    return np.clip(np.rint(np.asarray(values, dtype=float)), low, high).astype(int)


def text_metrics(pred: np.ndarray, target: np.ndarray, levels: tuple[int, int] | None) -> dict[str, float]:
    """r, rho and MSE on the raw scale; Acc, macro-F1 and QWK on levels when the scale is integer."""
    pred, target = np.asarray(pred, dtype=float).ravel(), np.asarray(target, dtype=float).ravel()
    if len(pred) != len(target):
        raise ValueError(f"{len(pred)} predictions for {len(target)} targets")
    if len(pred) == 0:
        return {name: float("nan") for name in TEXT_METRICS}
    shared = metric_values(pred, target)  # the project's r, rho and MSE, with its constant-means-0 convention
    out = {name: shared[name] for name in ("pearson", "spearman", "mse")}
    if levels is None:
        out.update(accuracy=float("nan"), macro_f1=float("nan"), qwk=float("nan"))
        return out
    p, t = to_levels(pred, levels), to_levels(target, levels)
    labels = list(range(levels[0], levels[1] + 1))
    out["accuracy"] = float(accuracy_score(t, p))
    out["macro_f1"] = float(f1_score(t, p, labels=labels, average="macro", zero_division=0))
    out["qwk"] = 0.0 if len(np.unique(p)) == 1 and len(np.unique(t)) == 1 else \
        float(np.nan_to_num(cohen_kappa_score(t, p, labels=labels, weights="quadratic")))
    return out


def infer_levels(values: np.ndarray) -> tuple[int, int] | None:
    """(min, max) when every label is an integer, else None (no level metrics)."""
    values = np.asarray(values, dtype=float)
    if len(values) and np.allclose(values, np.rint(values)):
        return int(values.min()), int(values.max())
    return None


def summarize_folds(per_fold: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean and sample standard deviation of every metric over folds."""
    names = per_fold[0].keys()
    return {n: {"mean": float(np.mean([f[n] for f in per_fold])),
                "std": float(np.std([f[n] for f in per_fold], ddof=1)) if len(per_fold) > 1 else 0.0} for n in names}


def format_fold_table(rows: dict[str, dict[str, dict[str, float]]], metrics: tuple[str, ...] = TEXT_METRICS) -> str:
    """Markdown table of mean ± std per row (a model or baseline) and metric."""
    lines = ["| | " + " | ".join(SYMBOLS[m] for m in metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for name, summary in rows.items():
        cells = [f"{summary[m]['mean']:.3f} ± {summary[m]['std']:.3f}" if m in summary and np.isfinite(summary[m]["mean"])
                 else "n/a" for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
