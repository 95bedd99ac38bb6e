"""Split-conformal prediction intervals (Vovk et al. 2005; Lei et al. 2018, "Distribution-Free
Predictive Inference for Regression"): the score +- q, where q is a finite-sample quantile of the
absolute residuals |rated - predicted| on the validation split (the calibration items, never used to fit
the weights). For a new item exchangeable with the calibration items the interval holds its rating with
probability at least the nominal coverage 1 - alpha (marginally, over items; not conditional on one
input), and the width is the same for every input. No checkpoint holds an ensemble (a text model's
cross-fitted expert copies only give the stack its held-out inputs; scores come from one refit), so plain
split conformal applies to every model.

The test report records, per level (fusion: window, rating) or output (text: each label, overall), the
half-width, the calibration size and the empirical coverage on the evaluated split (`test_metrics.json`
"intervals"); the model card, `empathic-predict` and the app show intervals of that half-width.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

METHOD = "split conformal"
CALIBRATION = "validation split"


def conformal_rank(n: int, coverage: float) -> int:
    """The rank k = ceil((n + 1) x coverage) of the calibration residual that is the half-width; above n
    (too few calibration items for that coverage) the interval is unbounded."""
    return int(math.ceil((n + 1) * coverage - 1e-9))  # the tolerance keeps (19 + 1) x 0.95 at 19


def conformal_half_width(residuals: np.ndarray, coverage: float) -> float:
    """The k-th smallest absolute residual (k = conformal_rank), or inf when k > n."""
    values = np.sort(np.abs(np.asarray(residuals, dtype=float)))
    k = conformal_rank(len(values), coverage)
    return float(values[k - 1]) if 1 <= k <= len(values) else math.inf


def _finite_pairs(predicted: np.ndarray, rated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    predicted, rated = np.asarray(predicted, dtype=float).ravel(), np.asarray(rated, dtype=float).ravel()
    keep = np.isfinite(predicted) & np.isfinite(rated)
    return predicted[keep], rated[keep]


def calibrate(val_predicted: np.ndarray, val_rated: np.ndarray, test_predicted: np.ndarray, test_rated: np.ndarray,
              coverage: float) -> dict[str, Any]:
    """One level's or output's interval: half-width from the validation residuals, its empirical
    coverage on the test items (all on the rating scale). `half_width` is None when unbounded (JSON has
    no infinity); no calibration items give no interval."""
    val_predicted, val_rated = _finite_pairs(val_predicted, val_rated)
    test_predicted, test_rated = _finite_pairs(test_predicted, test_rated)
    n = len(val_rated)
    if n == 0:
        return {"half_width": None, "n_calibration": 0, "n_test": len(test_rated), "test_coverage": None,
                "unbounded": False, "note": "no validation items: no interval"}
    q = conformal_half_width(val_rated - val_predicted, coverage)
    covered = np.abs(test_rated - test_predicted) <= q
    result = {"half_width": q if math.isfinite(q) else None, "n_calibration": n, "n_test": len(test_rated),
              "test_coverage": float(covered.mean()) if len(covered) else None, "unbounded": not math.isfinite(q)}
    if not math.isfinite(q):
        result["note"] = (f"{n} calibration items are too few for {coverage:.0%} coverage (it needs "
                          f"(n + 1) x {coverage:g} <= n): the interval is the whole scale")
    return result


def interval_report(items: dict[str, dict[str, Any]], coverage: float, in_sample: bool, key: str) -> dict[str, Any]:
    """test_metrics.json's "intervals": the method, nominal coverage, calibration split and `items` (the
    `calibrate` results) under `key` ("levels" or "outputs")."""
    report = {"method": METHOD, "coverage": float(coverage), "calibration": CALIBRATION, "in_sample": bool(in_sample),
              key: items}
    if in_sample:
        report["note"] = ("the evaluated split is the calibration split (split=val): the coverage is in-sample, "
                          "not a test of the interval")
    return report


def format_intervals(report: dict[str, Any]) -> str:
    """Markdown table of the intervals (one row per level or output) and what they mean."""
    items = report.get("levels") or report.get("outputs") or {}
    rows = []
    for name, item in items.items():
        width = ("unbounded" if item.get("unbounded") else "none" if item["half_width"] is None
                 else f"+-{item['half_width']:.3f}")
        tested = item.get("test_coverage")
        rows.append({"": name, "half-width": width, "n calibration": item["n_calibration"],
                     "nominal": f"{report['coverage']:.0%}",
                     "test coverage": "n/a" if tested is None else f"{tested:.1%} of {item['n_test']}"})
    table = pd.DataFrame(rows).to_markdown(index=False, colalign=["left"] * 5)
    notes = [f"{report['coverage']:.0%} {report['method']} intervals (half-width on the rating scale from the "
             f"{report['calibration']}'s absolute residuals; test coverage: share of evaluated items inside):"]
    notes += [f"{name}: {item['note']}" for name, item in items.items() if item.get("note")]
    if report.get("note"):
        notes.append(report["note"])
    return notes[0] + "\n\n" + table + ("\n\n" + "\n".join(notes[1:]) if len(notes) > 1 else "")


@dataclass(frozen=True)
class ConformalInterval:
    """One output's recorded interval, as the model card reads it back."""

    half_width: float  # on the rating scale; inf: the calibration set was too small (the whole scale)
    coverage: float  # nominal
    n_calibration: int
    test_coverage: float | None
    n_test: int
    in_sample: bool = False

    @classmethod
    def read(cls, item: dict[str, Any], report: dict[str, Any]) -> "ConformalInterval | None":
        """From one entry of test_metrics.json's "intervals" (None: the entry holds no interval)."""
        if item.get("half_width") is None and not item.get("unbounded"):
            return None
        width = math.inf if item.get("unbounded") else float(item["half_width"])
        tested = item.get("test_coverage")
        return cls(width, float(report["coverage"]), int(item["n_calibration"]),
                   None if tested is None else float(tested), int(item.get("n_test") or 0),
                   bool(report.get("in_sample")))

    def describe(self) -> str:
        """E.g. "+-0.812 (40 calibration items; 88.0% of 50 test items inside)"."""
        width = ("the whole scale (too few calibration items)" if math.isinf(self.half_width)
                 else f"+-{self.half_width:.3f}")
        tested = ("test coverage not measured" if self.test_coverage is None else
                  f"{self.test_coverage:.1%} of {self.n_test} {'validation (in-sample)' if self.in_sample else 'test'} "
                  "items inside")
        return f"{width} ({self.n_calibration} calibration items; {tested})"


def fusion_intervals(predictions: dict[str, Any], val_predictions: dict[str, Any], to_rating, coverage: float,
                     in_sample: bool) -> dict[str, Any]:
    """A fusion model's intervals per window and per rating (a rating: its windows averaged), from
    `predict_split`-style tensors on the target scale, mapped onto the rating scale with `to_rating`."""
    def rated(values: dict[str, Any], key: str) -> np.ndarray:
        return np.asarray(to_rating(np.asarray(values[key], dtype=float)), dtype=float)

    levels = {level: calibrate(rated(val_predictions, f"{level}_pred"), rated(val_predictions, f"{level}_target"),
                               rated(predictions, f"{level}_pred"), rated(predictions, f"{level}_target"), coverage)
              for level in ("window", "rating")}
    return interval_report(levels, coverage, in_sample, "levels")
