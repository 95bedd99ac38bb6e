"""The training oversampler under DDP: each sampled window once across processes per epoch."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

from empathic_fusion.datamodules.sampler import RatingOversampler, oversampled_indices

CLASSES = np.random.default_rng(0).integers(1, 6, size=203)  # imbalanced 1-5 ratings


@pytest.mark.parametrize("world", [2, 3, 4])
def test_shards_partition_the_epoch_order(world):
    shards = [RatingOversampler(CLASSES, seed=7, num_replicas=world, rank=r) for r in range(world)]
    for epoch in range(3):
        for sampler in shards:
            sampler.set_epoch(epoch)
        drawn = [list(s) for s in shards]
        order = shards[0].epoch_order(epoch)
        kept = len(order) - len(order) % world
        # every process runs the same number of samples, and together they are the epoch's order cut
        # to a multiple of the world size: no sampled window twice, none but the < world tail left out
        assert {len(d) for d in drawn} == {len(shards[0])} == {kept // world}
        interleaved = np.stack(drawn, axis=1).reshape(-1)
        np.testing.assert_array_equal(interleaved, order[:kept])
        assert Counter(np.concatenate(drawn).tolist()) == Counter(order[:kept].tolist())


def test_one_process_keeps_the_single_device_order():
    sampler = RatingOversampler(CLASSES, seed=3)
    for epoch in range(3):  # epochs advance on their own when nobody calls set_epoch
        expected = oversampled_indices(CLASSES, np.random.default_rng([3, epoch]))
        assert list(sampler) == expected.tolist()
    assert len(sampler) == len(expected)
    counts = Counter(CLASSES[expected].tolist())
    assert len(set(counts.values())) == 1  # balanced: every class as often as the largest


def test_epochs_reshuffle_and_set_epoch_replays():
    sampler = RatingOversampler(CLASSES, seed=1, num_replicas=2, rank=1)
    sampler.set_epoch(4)
    first = list(sampler)
    sampler.set_epoch(5)
    assert list(sampler) != first
    sampler.set_epoch(4)  # a resumed run replays the same epoch
    assert list(sampler) == first


def test_lightning_keeps_it_instead_of_wrapping_it():
    # Lightning wraps any sampler that is not a DistributedSampler (padding shards with repeats)
    assert isinstance(RatingOversampler(CLASSES), DistributedSampler)


def test_bad_rank_or_empty_split_is_refused():
    with pytest.raises(ValueError, match="rank"):
        RatingOversampler(CLASSES, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="at least one"):
        RatingOversampler(np.array([], dtype=int))
