"""The `evaluation` group: how a checkpoint's test report is made (empathic_fusion/evaluation/report.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from empathic_fusion.config.checks import ConfigError, finite, one_of, require
from empathic_fusion.dataset.scale import RatingScale

THRESHOLD_MODES = ("fixed", "validation")


@dataclass
class EvaluationConfig:
    """Acc/F1 threshold, participant-bootstrap confidence intervals and plots of the test report."""

    threshold: str = "fixed"       # fixed: threshold_rating; validation: the prediction cutoff maximising F1 on the
    #                                validation split (never on test)
    threshold_rating: Optional[float] = None  # a rating above it counts as "empathized"; null: the midpoint of
    #                                the rating scale (dataset.yaml's rating_scale, 3 on the default 1-5; a text
    #                                table's data.levels, else 3)
    bootstrap: int = 1000          # participant resamples for the CIs; 0 = no intervals
    confidence: float = 0.95
    bootstrap_seed: int = 0
    plots: bool = True             # PNG plots next to the metrics
    interval_coverage: float = 0.9  # nominal coverage of the split-conformal score intervals, calibrated on the
    #                                validation split (empathic_fusion/evaluation/conformal.py)

    def __post_init__(self) -> None:
        require("evaluation", self, {
            "threshold": (self.threshold in THRESHOLD_MODES, one_of(THRESHOLD_MODES)),
            "threshold_rating": (self.threshold_rating is None or finite(self.threshold_rating),
                                 "null (the rating scale's midpoint) or a finite number"),
            "bootstrap": (self.bootstrap >= 0, "an integer >= 0 (participant resamples; 0 = no intervals)"),
            "confidence": (finite(self.confidence) and 0 < self.confidence < 1,
                           "a number strictly between 0 and 1"),
            "interval_coverage": (finite(self.interval_coverage) and 0 < self.interval_coverage < 1,
                                  "a number strictly between 0 and 1 (the intervals' nominal coverage)")})


def threshold_rating_on(scale: RatingScale, threshold_rating: float | None, source: str) -> float:
    """The Acc/F1 threshold as a rating on `scale`: `evaluation.threshold_rating`, or the scale's midpoint
    when it is null. A threshold outside the scale is a ConfigError naming the scale and where it comes from
    (`source`, e.g. "the rating_scale of dataset.yaml")."""
    if threshold_rating is None:
        return scale.midpoint
    if not scale.contains(float(threshold_rating)):
        raise ConfigError([f"evaluation.threshold_rating={threshold_rating}: must be a rating within the scale "
                           f"{scale} ({source}), or null for its midpoint"])
    return float(threshold_rating)
