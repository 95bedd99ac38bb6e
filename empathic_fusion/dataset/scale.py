"""The rating scales of the dataset contract and the one mapping between ratings and model targets.

A dataset declares the scale of its self-ratings in dataset.yaml (`rating_scale: [low, high]`); the
default is EmpathicStories++'s 1-5 slider (`SELF_REPORT`). Fusion models predict on the cosine-similarity
range [-1, 1], so a rating maps to (rating - midpoint) / half-range: on 1-5, 1 -> -1, 3 -> 0, 5 -> 1;
on 1-7, (rating - 4) / 3. The scale travels with the data (EmpathyDataset.rating_scale), with the
datamodule's describe() and so with every checkpoint ("scale" of its data_info), so windows, reports,
thresholds, `empathic-predict` and the app all convert with the scale the model was trained on instead
of writing the numbers again. The survey traits are a scale of their own (`TRAIT_SCALE`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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

    def bounds(self) -> list[float]:
        """[low, high], as dataset.yaml writes it and a checkpoint records it."""
        return [float(self.low), float(self.high)]

    def __str__(self) -> str:
        return f"{self.low:g}-{self.high:g}"


SELF_REPORT = RatingScale(1.0, 5.0)  # self-rated empathy towards a story (the slider): dataset.yaml's default
TRAIT_SCALE = RatingScale(1.0, 5.0)  # Big Five item means and the Single Item Trait Empathy Scale


def recorded_scale(data_info: Mapping[str, Any] | None) -> RatingScale:
    """The rating scale a datamodule's describe() (a checkpoint's `data_info`) records; checkpoints
    written before datasets declared their scale were all trained on the 1-5 self-report scale."""
    scale = (data_info or {}).get("scale")
    return RatingScale(float(scale[0]), float(scale[1])) if scale else SELF_REPORT
