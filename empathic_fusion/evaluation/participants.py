"""Per-participant breakdown and bootstrap confidence intervals that resample participants.

Ratings of one participant are not independent (same person, same sessions), so a confidence
interval that resamples ratings is too narrow; resampling whole participants keeps that structure.
Inputs are rating-level (or window-level) tables with `participant_id`, `predicted` and `rated`
on the rating scale; metrics are computed on the cosine scale of the fusion model's rating `scale`
((rating - midpoint) / half-range, (rating - 3) / 2 on the default 1-5) like everywhere else, with MSE
and MAE on the rating scale (metrics.py), or, with `scale=None`, on the table's own scale (text labels,
grouped by writer or conversation).
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pandas as pd
import torch

from empathic_fusion.dataset.scale import SELF_REPORT, RatingScale
from empathic_fusion.metrics import ALL_METRIC_NAMES, empathy_metrics, metric_values

REQUIRED_COLUMNS = ("participant_id", "predicted", "rated")


def check_prediction_table(table: pd.DataFrame) -> None:
    """A ValueError naming the columns a prediction table lacks (REQUIRED_COLUMNS)."""
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"prediction table lacks column(s) {missing}; it has {list(table.columns)}")


Scale = RatingScale | None  # the fusion model's rating scale (metrics on its cosine scale); None: the table's own


def on_scale(values: np.ndarray, scale: Scale) -> np.ndarray:
    """Ratings as float64 on the scale the metrics are computed on."""
    return np.asarray(values, dtype=np.float64) if scale is None else scale.to_target(values)


def half_range(scale: Scale) -> float:
    """What takes errors on the computing scale back to the table's rating scale (metric_values' `half_range`)."""
    return 1.0 if scale is None else scale.half_range


def _threshold(threshold_rating: float, scale: Scale) -> float:
    """The threshold rating on the scale the metrics are computed on (mapped like the ratings)."""
    return float(threshold_rating) if scale is None else float(scale.to_target(threshold_rating))


def _scores(table: pd.DataFrame, threshold_rating: float, pred_threshold: float | None,
            scale: Scale) -> dict[str, float]:
    pred = torch.tensor(on_scale(table["predicted"].to_numpy(float), scale))
    true = torch.tensor(on_scale(table["rated"].to_numpy(float), scale))
    return empathy_metrics(pred, true, _threshold(threshold_rating, scale), pred_threshold, half_range(scale))


def per_participant(table: pd.DataFrame, threshold_rating: float = SELF_REPORT.midpoint,
                    pred_threshold: float | None = None, scale: Scale = SELF_REPORT) -> pd.DataFrame:
    """One row per participant: number of items, every metric, and whether r is defined.

    With a handful of ratings per person, r is often undefined (constant ratings): it is then 0 as
    everywhere and `r_defined` is False, so a plot or summary can leave it out.
    """
    check_prediction_table(table)
    rows = []
    for participant, group in table.groupby("participant_id", sort=True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # degenerate per-person cases are flagged in r_defined instead
            values = _scores(group, threshold_rating, pred_threshold, scale)
        defined = len(group) >= 2 and group["predicted"].nunique() > 1 and group["rated"].nunique() > 1
        rows.append({"participant_id": participant, "n": len(group), **values, "r_defined": defined})
    return pd.DataFrame(rows)


def participant_resamples(n_participants: int, n_boot: int, seed: int) -> Iterator[np.ndarray]:
    """The participant indices (0..n-1, in participant_id order) of each of `n_boot` resamples with
    replacement: one stream per seed, so every interval drawn from it resamples the same participants."""
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        yield rng.integers(0, n_participants, n_participants)


def bootstrap_ci(table: pd.DataFrame, n_boot: int = 1000, confidence: float = 0.95, seed: int = 0,
                 threshold_rating: float = SELF_REPORT.midpoint, pred_threshold: float | None = None,
                 scale: Scale = SELF_REPORT) -> dict[str, dict[str, float]]:
    """Percentile CI per metric from `n_boot` resamples of participants (with replacement).

    Returns {metric: {"estimate", "low", "high"}}; with fewer than 2 participants the interval is
    the point estimate (warned), since there is nothing to resample.
    """
    check_prediction_table(table)
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimate = _scores(table, threshold_rating, pred_threshold, scale)
    groups = [g for _, g in table.groupby("participant_id", sort=True)]
    if len(groups) < 2 or n_boot < 1:
        warnings.warn(f"bootstrap_ci: {len(groups)} participant(s); the interval is the point estimate", stacklevel=2)
        return {m: {"estimate": estimate[m], "low": estimate[m], "high": estimate[m]} for m in ALL_METRIC_NAMES}
    pred = [on_scale(g["predicted"].to_numpy(float), scale) for g in groups]
    true = [on_scale(g["rated"].to_numpy(float), scale) for g in groups]
    draws = np.empty((n_boot, len(ALL_METRIC_NAMES)))
    threshold = _threshold(threshold_rating, scale)
    # a degenerate resample counts with its defined value (0), as in empathy_metrics
    for b, pick in enumerate(participant_resamples(len(groups), n_boot, seed)):
        values = metric_values(np.concatenate([pred[i] for i in pick]), np.concatenate([true[i] for i in pick]),
                              threshold, pred_threshold, half_range(scale))
        draws[b] = [values[m] for m in ALL_METRIC_NAMES]
    alpha = (1 - confidence) / 2
    low, high = np.quantile(draws, [alpha, 1 - alpha], axis=0)
    return {m: {"estimate": estimate[m], "low": float(low[i]), "high": float(high[i])}
            for i, m in enumerate(ALL_METRIC_NAMES)}
