"""The datamodule: windows as views into the store, splits by participant, selected modalities only."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
from empathic_fusion.features.store import FeatureStore
from tests.conftest import FEATURES_CFG


def _datamodule(dataset, store, modalities=("video", "audio", "text"), **kwargs) -> FusionDataModule:
    dm = FusionDataModule(str(dataset), str(store), list(modalities), FEATURES_CFG, batch_size=8,
                           extract_workers=1, **kwargs)
    dm.setup("fit")
    return dm


def test_batches_follow_the_contract(tiny_dataset, tiny_store):
    dm = _datamodule(tiny_dataset, tiny_store)
    batch = next(iter(dm.train_dataloader()))
    assert batch["video"]["x"].shape == (8, 120, dm.input_dims["video"])
    assert batch["audio"]["x"].shape == (8, 120, 65) and batch["text"]["x"].shape == (8, 120, 384)
    assert batch["video"]["mask"].dtype == torch.bool and batch["video"]["lengths"].tolist() == [120] * 8
    assert batch["story"].shape == (8, 384) and batch["traits"].shape == (8, 6)
    assert batch["target"].min() >= -1 and batch["target"].max() <= 1
    # masked frames carry zeros; audio is masked where the participant is silent
    for m in ("video", "audio", "text"):
        assert not batch[m]["x"][~batch[m]["mask"]].any()
    assert 0 < batch["audio"]["mask"].float().mean() < 1


def test_windows_per_split_and_no_participant_in_two_splits(tiny_dataset, tiny_store):
    dm = _datamodule(tiny_dataset, tiny_store)
    ratings = dm.ratings
    owners = {s: set(ratings.participant_id.loc[dm.windows[dm.windows.split == s].rating_index]) for s in ("train", "val", "test")}
    assert owners["train"].isdisjoint(owners["val"]) and owners["train"].isdisjoint(owners["test"])
    assert owners["val"].isdisjoint(owners["test"])
    assert [len(owners[s]) for s in ("train", "val", "test")] == [28, 8, 4]
    # story share: agent prompt at 1.3 s to the story's end at 11.5 s = frames 19..173 -> 3 windows
    per_rating = dm.windows.groupby("rating_index").start.apply(list)
    assert all(s == [19, 34, 49] for s in per_rating)
    assert len(dm.windows) == 40 * 3 * 3
    assert (tiny_store / "splits").exists() and dm.split_hash == _datamodule(tiny_dataset, tiny_store).split_hash


def test_window_items_are_views_of_the_store(tiny_dataset, tiny_store):
    dm = _datamodule(tiny_dataset, tiny_store, normalize=())
    data = dm.datasets["train"]
    window = data.windows.iloc[0]
    item = data[0]
    face = FeatureStore(tiny_store).load(window.session_id, "face", "features")
    expected = np.asarray(face[window.start: window.start + 120], dtype=np.float32)
    mask = item["video"]["mask"].numpy()
    assert np.array_equal(item["video"]["x"].numpy()[mask], expected[mask])


def test_only_selected_modalities_are_read(tiny_dataset, tiny_store, monkeypatch):
    opened = []
    original = FeatureStore.load
    monkeypatch.setattr(FeatureStore, "load", lambda self, owner, branch, name, mmap=True:
                        opened.append(branch) or original(self, owner, branch, name, mmap))
    dm = _datamodule(tiny_dataset, tiny_store, ("video", "text"))
    for split in ("train", "val", "test"):
        for i in range(0, len(dm.datasets[split]), 7):
            assert set(dm.datasets[split][i]) >= {"video", "text"} and "audio" not in dm.datasets[split][i]
    assert "audio" not in opened and {"face", "text"} <= set(opened)


def test_reflection_scenario_and_oversampled_training(tiny_dataset, tiny_store):
    dm = _datamodule(tiny_dataset, tiny_store, ("text",), scenario="reflection")
    per_rating = dm.windows.groupby("rating_index").size()
    assert per_rating.index.size == 120 and (per_rating == 1).all()  # 4 s reflections: one centred window
    train = dm.datasets["train"]
    order = np.concatenate(list(dm.train_dataloader().sampler))  # batches of window positions
    classes = np.round(train.ratings[order]).astype(int)
    counts = np.bincount(classes)[1:]
    assert len(set(counts[counts > 0])) == 1  # every present rating class equally often


def test_failed_branch_is_masked_and_missing_transcript_skipped(dataset_copy, store_copy):
    import shutil

    sessions = pd.read_csv(dataset_copy / "sessions.csv").session_id
    shutil.rmtree(store_copy / "sessions" / sessions[0] / "face")
    (dataset_copy / "transcripts" / f"{sessions[1]}.csv").unlink()
    dm = _datamodule(dataset_copy, store_copy)
    assert any(sessions[0] in w and "video is masked" in w for w in dm.warnings)
    assert any(sessions[1] in w and "transcript" in w for w in dm.warnings)
    assert sessions[1] not in set(dm.windows.session_id)
    rows = dm.windows.index[dm.windows.session_id == sessions[0]]
    split = dm.windows.loc[rows[0], "split"]
    data = dm.datasets[split]
    position = list(data.windows.session_id).index(sessions[0])
    item = data[position]
    assert not item["video"]["mask"].any() and item["text"]["mask"].any()


def test_bad_modality_is_rejected(tiny_dataset, tiny_store):
    with pytest.raises(ValueError, match="modalities"):
        FusionDataModule(str(tiny_dataset), str(tiny_store), ["smell"], FEATURES_CFG)
