"""The rating scales of the dataset contract and the one mapping between ratings and model targets.

Self-rated empathy and the survey traits are 1-5 (EmpathicStories++). Fusion models predict on the
cosine-similarity range [-1, 1], so a rating maps to (rating - midpoint) / half-range: 1 -> -1, 3 -> 0,
5 -> 1. Everything that converts (windows, reports, the app, thresholds for accuracy and F1) uses the
scale objects here instead of writing the numbers again.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RatingScale:
    """A closed rating range [low, high] and its affine map onto [-1, 1]."""

    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.low < self.high:
            raise ValueError(f"a rating scale needs low < high, got {self.low:g}-{self.high:g}")

    @property
    def midpoint(self) -> float:
        return (self.low + self.high) / 2.0

    @property
    def half_range(self) -> float:
        return (self.high - self.low) / 2.0

    def to_target(self, rating: np.ndarray | float) -> np.ndarray | float:
        """Ratings onto [-1, 1] (the midpoint -> 0)."""
        return (np.asarray(rating, dtype=np.float64) - self.midpoint) / self.half_range

    def to_rating(self, target: np.ndarray | float) -> np.ndarray | float:
        """Targets on [-1, 1] back onto the rating scale (not clipped)."""
        return np.asarray(target, dtype=np.float64) * self.half_range + self.midpoint

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def __str__(self) -> str:
        return f"{self.low:g}-{self.high:g}"


SELF_REPORT = RatingScale(1.0, 5.0)  # self-rated empathy towards a story (the slider)
TRAIT_SCALE = RatingScale(1.0, 5.0)  # Big Five item means and the Single Item Trait Empathy Scale


def rating_to_target(rating: np.ndarray | float) -> np.ndarray | float:
    """Self-ratings onto the cosine similarity's range [-1, 1] (3 -> 0)."""
    return SELF_REPORT.to_target(rating)


def target_to_rating(target: np.ndarray | float) -> np.ndarray | float:
    """Model targets back onto the self-rating scale."""
    return SELF_REPORT.to_rating(target)
