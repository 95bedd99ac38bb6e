"""The `evaluation` group: how a checkpoint's test report is made (empathic_fusion/evaluation/report_parts.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from empathic_fusion.config.checks import ConfigError, finite, one_of, require
from empathic_fusion.dataset.scale import RatingScale

THRESHOLD_MODES = ("fixed", "validation")
MISSING_RATES = [round(0.1 * k, 1) for k in range(10)]  # 0, 0.1, ..., 0.9


@dataclass
class EvaluationConfig:
    """Acc/F1 threshold, participant-bootstrap confidence intervals, plots and results per participant group
    of the test report."""

    threshold: str = "fixed"       # fixed: threshold_rating; validation: the prediction cutoff maximising F1 on the
    #                                validation split (never on test)
    threshold_rating: Optional[float] = None  # a rating above it counts as "empathized"; null: the midpoint of
    #                                the rating scale (dataset.yaml's rating_scale, 3 on the default 1-5; a text
    #                                table's data.levels, else 3)
    bootstrap: int = 1000          # participant resamples for the CIs; 0 = no intervals
    confidence: float = 0.95
    bootstrap_seed: int = 0
    plots: bool = True             # PNG plots next to the metrics
    missing_modalities: bool = True  # fusion models: the test split again with modalities removed and frames
    #                                dropped (test_missing_modalities.csv; empathic_fusion/evaluation/missing_modalities.py)
    missing_rates: List[float] = field(default_factory=lambda: list(MISSING_RATES))  # fractions of frames
    #                                dropped, at random and in one block; ascending from 0, each below 1
    groups: List[str] = field(default_factory=list)  # attributes to report results per group of (participants.csv
    #                                columns; a text table's columns); empty: no group report (evaluation/groups.py)
    min_group_size: int = 5        # participants a reported group needs; smaller groups are pooled
    group_bins: int = 3            # a numeric attribute with more distinct values is cut into this many quantile bins
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
            "missing_rates": (_rates_ok(list(self.missing_rates)),
                              "ascending fractions of frames in [0, 1), starting at 0 (e.g. [0, 0.25, 0.5])"),
            "groups": (all(isinstance(g, str) and g.strip() for g in self.groups)
                       and len(set(self.groups)) == len(self.groups), "a list of distinct, non-empty attribute names"),
            "min_group_size": (self.min_group_size >= 1, "an integer >= 1 (participants per reported group)"),
            "group_bins": (self.group_bins >= 2, "an integer >= 2 (quantile bins of a numeric attribute)"),
            "interval_coverage": (finite(self.interval_coverage) and 0 < self.interval_coverage < 1,
                                  "a number strictly between 0 and 1 (the intervals' nominal coverage)")})


def _rates_ok(rates: list) -> bool:
    """0 first (the reference: nothing missing), then strictly ascending, each below 1."""
    return (bool(rates) and all(finite(r) for r in rates) and rates[0] == 0 and rates[-1] < 1
            and all(a < b for a, b in zip(rates, rates[1:])))


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
