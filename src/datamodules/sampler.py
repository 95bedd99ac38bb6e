"""Oversampling by rating for the training split (Appendix B): every rating class is drawn as
often as the most frequent one, reshuffled each epoch."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Sampler


def oversampled_indices(classes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices in which each class appears as often as the largest class (minorities resampled)."""
    values, counts = np.unique(classes, return_counts=True)
    target = counts.max()
    picks = []
    for value in values:
        members = np.flatnonzero(classes == value)
        extra = rng.choice(members, size=target - len(members), replace=True) if len(members) < target else []
        picks.append(np.concatenate([members, np.asarray(extra, dtype=np.int64)]))
    out = np.concatenate(picks)
    rng.shuffle(out)
    return out


class RatingOversampler(Sampler[int]):
    """Balanced, seeded, epoch-dependent order of training windows."""

    def __init__(self, classes: np.ndarray, seed: int = 0):
        self.classes = np.asarray(classes)
        self.seed = seed
        self.epoch = 0
        self._length = int(np.unique(self.classes, return_counts=True)[1].max() * len(np.unique(self.classes)))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1
        return iter(torch.as_tensor(oversampled_indices(self.classes, rng)).tolist())

    def __len__(self) -> int:
        return self._length
