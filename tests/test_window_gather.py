"""The batched window gather against the per-window reference (`WindowDataset`): every window's
every batch key identical (values, dtypes, shapes) for every split, on the demo store, with the frame
arrays in memory and out of core (the normalised frame cache on disk)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from empathic_fusion.dataset import load_dataset
from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
from empathic_fusion.datamodules.sampler import RatingOversampler
from empathic_fusion.datamodules.window_gather import HostBuffers, IndexBatchSampler, WindowBatches
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features.store import FeatureStore
from tests.conftest import FEATURES_CFG
from tests.test_features_modalities import _plant_cnn


def _pair(dataset, store, modalities, features=FEATURES_CFG, frames="auto",
          **kwargs) -> tuple[FusionDataModule, FusionDataModule]:
    made = []
    for loader in ("reference", "batched"):
        dm = FusionDataModule(str(dataset), str(store), list(modalities), features, batch_size=8,
                               extract_workers=1, loader=loader, frames=frames, **kwargs)
        dm.setup("fit")
        made.append(dm)
    return made[0], made[1]


def assert_same(expected, actual, where: str = "batch") -> None:
    if isinstance(expected, dict):
        assert set(expected) == set(actual), where
        for key in expected:
            assert_same(expected[key], actual[key], f"{where}.{key}")
        return
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, where
    assert torch.equal(expected, actual), where


def assert_splits_equal(reference: FusionDataModule, batched: FusionDataModule) -> None:
    for split in ("train", "val", "test"):
        old, new = reference.datasets[split], batched.datasets[split]
        assert isinstance(new, WindowBatches) and len(old) == len(new) > 0
        everything = next(iter(DataLoader(old, batch_size=len(old))))  # default collation of every window
        assert_same(everything, new[list(range(len(new)))], split)
        assert_same(old[len(old) - 1], new[len(new) - 1], f"{split} item")


@pytest.mark.parametrize("frames", ["memory", "disk"])
@pytest.mark.parametrize("modalities,normalize", [(("video", "audio", "text"), ("video", "audio")),
                                                  (("audio", "text"), ())])
def test_batched_gather_equals_window_dataset(tiny_dataset, store_copy, modalities, normalize, frames):
    reference, batched = _pair(tiny_dataset, store_copy, modalities, normalize=normalize, frames=frames)
    assert bool(batched.frames.disk) == (frames == "disk")
    assert_splits_equal(reference, batched)


def test_equal_with_multi_branch_modalities_and_failed_branches(tiny_dataset, store_copy):
    """The paper's video = face + cnn (fp16 store) and text = SBERT + GloVe (indexed), one session's
    face and another's audio failed."""
    store = FeatureStore(store_copy)
    dataset = load_dataset(tiny_dataset)
    sessions = list(dataset.sessions.index)
    cfg = {**FEATURES_CFG, "modalities": {"video": ["face", "cnn"], "audio": ["audio"], "text": ["text", "glove"]}}
    _plant_cnn(store, dataset, cfg)
    extract_features(dataset, store, ["text"], cfg, progress=False)
    (store_copy / "sessions" / sessions[0] / "face" / "features.npy").unlink()
    (store_copy / "sessions" / sessions[1] / "audio" / "mask.npy").unlink()
    for frames in ("memory", "disk"):
        reference, batched = _pair(tiny_dataset, store_copy, ("video", "audio", "text"), cfg, frames=frames)
        assert batched.input_dims["video"] > 1451 and batched.input_dims["text"] == 384 + 50
        assert_splits_equal(reference, batched)


def test_loaders_yield_the_reference_windows_in_sampler_order(tiny_dataset, store_copy):
    reference, batched = _pair(tiny_dataset, store_copy, ("video", "audio", "text"))
    loader = batched.train_dataloader()
    assert isinstance(loader.sampler, DistributedSampler)  # Lightning leaves it in place under DDP
    order = np.array(list(RatingOversampler(np.round(batched.datasets["train"].ratings).astype(int))))
    seen = torch.cat([b["rating_index"] for b in loader])
    assert seen.tolist() == batched.datasets["train"].windows.rating_index.to_numpy()[order].tolist()
    val = next(iter(batched.val_dataloader()))
    assert_same(next(iter(reference.val_dataloader())), val)


def test_index_batches_keep_ddp_shards():
    classes = np.random.default_rng(0).integers(1, 6, size=53)
    for rank in range(2):
        shard = RatingOversampler(classes, seed=2, num_replicas=2, rank=rank)
        batches = IndexBatchSampler(RatingOversampler(classes, seed=2, num_replicas=2, rank=rank), 8)
        batches.set_epoch(3)
        shard.set_epoch(3)
        drawn = list(batches)
        assert len(drawn) == len(batches) and max(map(len, drawn)) == 8
        assert sum(drawn, []) == list(shard)
    with pytest.raises(ValueError, match="batch_size"):
        IndexBatchSampler(RatingOversampler(classes), 0)


@pytest.mark.parametrize("frames", ["memory", "disk"])
def test_held_batches_keep_their_values_while_buffers_are_reused(tiny_dataset, store_copy, frames):
    """Host batches are written into reused buffers: a batch (or a view of one) that is still held keeps
    its values while later batches are drawn, and a released batch's buffer is used again."""
    reference, batched = _pair(tiny_dataset, store_copy, ("video", "audio", "text"), frames=frames)
    kept = list(batched.val_dataloader())  # every batch held at once
    for expected, actual in zip(reference.val_dataloader(), kept, strict=True):
        assert_same(expected, actual)
    data = batched.datasets["train"]
    view = data[[0, 1, 2]]["video"]["x"][1]  # only a view of the batch survives
    copy = view.clone()
    for start in range(0, 24, 3):
        data[list(range(start + 3, start + 6))]
    assert torch.equal(view, copy)
    first = data[[4, 5, 6]]["video"]["x"].data_ptr()  # released at once
    assert data[[7, 8, 9]]["video"]["x"].data_ptr() == first


def test_a_buffer_filled_under_inference_mode_is_not_reused_outside_it():
    """A split tested (Lightning's inference mode) and then predicted under no_grad (the report's
    validation predictions when evaluate.py split=val tests the validation split) shares one dataset."""
    buffers = HostBuffers()
    source, rows = torch.arange(6.0), torch.tensor([0, 2, 4])
    with torch.inference_mode():
        tested = torch.index_select(source, 0, rows, out=buffers.take("x", (3,), torch.float32))
    del tested
    with torch.no_grad():
        out = torch.index_select(source, 0, rows, out=buffers.take("x", (3,), torch.float32))
    assert not out.is_inference() and out.tolist() == [0.0, 2.0, 4.0]
    assert len(buffers.buffers["x"]) == 2  # the inference-mode buffer stays for the next test batch
