"""Oversampling by rating for the training split (Appendix B): every rating class is drawn as
often as the most frequent one, reshuffled each epoch.

Under DDP every process builds the same epoch order (same seed and epoch) and keeps every
`num_replicas`-th position starting at its rank, so a distributed epoch sees each sampled window
once across processes. Being a `DistributedSampler`, Lightning leaves it in place instead of
wrapping it in one of its own (which would pad the shards with repeated windows).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler


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


def _world() -> tuple[int, int]:
    """(number of processes, this process's rank); (1, 0) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class RatingOversampler(DistributedSampler):
    """Balanced, seeded, epoch-dependent order of training windows, sharded by rank under DDP.

    `num_replicas`/`rank` default to torch.distributed's world (1 and 0 without it). With several
    processes the epoch order is cut to a multiple of `num_replicas` (at most `num_replicas - 1`
    draws of a shuffled balanced order are left out) so every process runs the same number of
    batches, as DDP requires.
    """

    def __init__(self, classes: np.ndarray, seed: int = 0, num_replicas: int | None = None,
                 rank: int | None = None):
        world, world_rank = _world()
        num_replicas = world if num_replicas is None else int(num_replicas)
        rank = world_rank if rank is None else int(rank)
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas), got rank={rank}, num_replicas={num_replicas}")
        self.classes = np.asarray(classes)
        if self.classes.size == 0:
            raise ValueError("RatingOversampler needs at least one training window")
        super().__init__(range(len(self.classes)), num_replicas=num_replicas, rank=rank, shuffle=False,
                         seed=seed, drop_last=True)
        self.epoch_length = int(np.unique(self.classes, return_counts=True)[1].max() * len(np.unique(self.classes)))
        if self.epoch_length < num_replicas:
            raise ValueError(f"{self.epoch_length} oversampled windows cannot be shared by {num_replicas} processes")
        self.num_samples = self.epoch_length // num_replicas
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The whole (unsharded) oversampled order of an epoch: identical in every process."""
        return oversampled_indices(self.classes, np.random.default_rng([self.seed, epoch]))

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_order(self.epoch)[: self.total_size]
        self.epoch += 1  # the next epoch reshuffles even when nobody calls set_epoch
        return iter(torch.as_tensor(order[self.rank:: self.num_replicas]).tolist())

    def __len__(self) -> int:
        return self.num_samples
