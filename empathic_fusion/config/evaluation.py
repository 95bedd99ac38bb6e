"""The `evaluation` group: how a checkpoint's test report is made (empathic_fusion/evaluation/report.py)."""
from __future__ import annotations

from dataclasses import dataclass

from empathic_fusion.config.checks import finite, one_of, require

THRESHOLD_MODES = ("fixed", "validation")


@dataclass
class EvaluationConfig:
    """Acc/F1 threshold, participant-bootstrap confidence intervals and plots of the test report."""

    threshold: str = "fixed"       # fixed: threshold_rating; validation: the prediction cutoff maximising F1 on the
    #                                validation split (never on test)
    threshold_rating: float = 3.0  # a rating above it counts as "empathized" (on data.levels' scale for text tables)
    bootstrap: int = 1000          # participant resamples for the CIs; 0 = no intervals
    confidence: float = 0.95
    bootstrap_seed: int = 0
    plots: bool = True             # PNG plots next to the metrics

    def __post_init__(self) -> None:
        require("evaluation", self, {
            "threshold": (self.threshold in THRESHOLD_MODES, one_of(THRESHOLD_MODES)),
            "threshold_rating": (finite(self.threshold_rating), "a finite number"),
            "bootstrap": (self.bootstrap >= 0, "an integer >= 0 (participant resamples; 0 = no intervals)"),
            "confidence": (finite(self.confidence) and 0 < self.confidence < 1,
                           "a number strictly between 0 and 1")})
