"""Oversampling by rating for the training split (Appendix B): every rating class is drawn as
often as the most frequent one, reshuffled each epoch.

Under DDP every process builds the same epoch order (same seed and epoch) and keeps every
`num_replicas`-th position starting at its rank, so a distributed epoch sees each sampled window
once across processes. Being a `DistributedSampler`, Lightning leaves it in place instead of
wrapping it in one of its own (which would pad the shards with repeated windows).

Both training orders (the oversampler and the plain shuffle) are `ResumableSampler`s and the training
loader is a `ResumableLoader`: Lightning saves the loader's place in the epoch with a mid-epoch checkpoint
and a run resumed from it trains the rest of that epoch, in the same order (utils/preemption.py).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


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


class ResumableSampler(DistributedSampler):
    """A `DistributedSampler` whose place in an epoch is a small state, so a run resumed mid-epoch draws the
    rest of that epoch's order: `state_dict()` (the epoch under way, the seed and the positions of the epoch's
    whole order taken so far, across processes) and `load_state_dict()` in a fresh sampler, whose next
    iteration then starts there. The order itself is rebuilt from (seed, epoch), as DistributedSampler's is.
    Counting positions of the whole order lets every rank start at the same place in its own shard."""

    _begun: int | None = None  # the epoch of the order under way (None: none begun)
    _taken = 0  # this process's positions of that order given out
    _start = 0  # positions of this process's shard that the next iteration skips

    def epoch_shard(self) -> list[int]:
        """This process's positions of epoch `self.epoch`, in order (DistributedSampler's)."""
        return list(super().__iter__())

    def __iter__(self) -> Iterator[int]:
        shard = self.epoch_shard()
        self._begun, self._taken, self._start = self.epoch, min(self._start, len(shard)), 0
        return self._given_out(shard[self._taken:])

    def _given_out(self, positions: list[int]) -> Iterator[int]:
        for position in positions:
            self._taken += 1
            yield position

    def resume_from(self, taken: int) -> None:
        """The next iteration starts after `taken` positions of the epoch's whole order (all processes')."""
        self._start = int(taken) // self.num_replicas

    def state_dict(self) -> dict[str, int]:
        epoch = self.epoch if self._begun is None else self._begun
        return {"epoch": int(epoch), "seed": int(self.seed), "taken": self._taken * self.num_replicas}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"the saved training order has seed {state['seed']}, this sampler {self.seed}: "
                             "a run resumes with the seed it was started with")
        self.set_epoch(int(state["epoch"]))
        self.resume_from(int(state["taken"]))


class RatingOversampler(ResumableSampler):
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

    def epoch_shard(self) -> list[int]:
        order = self.epoch_order(self.epoch)[: self.total_size]
        return torch.as_tensor(order[self.rank:: self.num_replicas]).tolist()

    def __iter__(self) -> Iterator[int]:
        positions = super().__iter__()
        self.epoch += 1  # the next epoch reshuffles even when nobody calls set_epoch
        return positions

    def __len__(self) -> int:
        return self.num_samples


def shuffled_windows(n: int, seed: int) -> ResumableSampler:
    """The plain training shuffle: each epoch a permutation of the `n` windows drawn from (seed, epoch),
    sharded by rank under DDP (DistributedSampler's order, which Lightning would otherwise put in its place)."""
    world, rank = _world()
    return ResumableSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)


class ResumableLoader(DataLoader):
    """The training DataLoader, whose place in an epoch is part of every checkpoint: Lightning saves its
    `state_dict()` and, when fit resumes mid-epoch, hands it to `load_state_dict()` before it makes the epoch's
    iterator (lightning/pytorch/loops/fit_loop.py), which then yields exactly the batches the interrupted epoch
    had not given out. It counts the batches it gave out, not the positions its sampler gave to prefetching
    workers. With a `ResumableSampler` (directly, or under an index batch sampler with `batch_size=None`) the
    sampler starts after them; any other sampler (one Lightning put in place, e.g. for overfit_batches) has its
    first batches drawn and dropped."""

    _given = 0  # batches the iteration under way gave out
    _skip = 0  # batches the next iteration leaves out (a resumed epoch's)

    def _order(self) -> tuple[ResumableSampler | None, int]:
        """The resumable sampler under the batches (None: there is none) and the positions of a batch."""
        sampler, per_batch = self.sampler, self.batch_size
        if per_batch is None:  # the sampler yields whole batches of the order it wraps (IndexBatchSampler)
            sampler, per_batch = getattr(sampler, "windows", None), getattr(sampler, "batch_size", 1)
        return (sampler if isinstance(sampler, ResumableSampler) else None), int(per_batch)

    def __iter__(self) -> Iterator[Any]:
        skip, self._skip = self._skip, 0
        order, per_batch = self._order()
        if order is not None:
            order.resume_from(skip * per_batch * order.num_replicas)  # also 0: a fresh epoch starts at its start
            batches = super().__iter__()
        else:
            batches = islice(super().__iter__(), skip, None)
        self._given = skip
        return self._counted(batches)

    def _counted(self, batches: Iterable[Any]) -> Iterator[Any]:
        for batch in batches:
            self._given += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        order, _ = self._order()
        return {"batches": self._given, "order": order.state_dict() if order is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        order, _ = self._order()
        if order is not None and state.get("order") is not None:
            order.load_state_dict(state["order"])
        self._skip = int(state["batches"])
