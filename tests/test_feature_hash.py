"""The run's feature_manifest_hash identifies every feature a model saw, the story embeddings included."""
from __future__ import annotations

import pandas as pd
import pytest

from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule, feature_manifest_hash
from empathic_fusion.dataset import load_dataset
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features.store import DATASET_KEY, FeatureStore
from tests.conftest import FEATURES_CFG


def _hash(dataset, store) -> str:
    dm = FusionDataModule(str(dataset), str(store), ["audio", "text"], FEATURES_CFG, batch_size=8, extract_workers=1)
    dm.setup("fit")
    return dm.describe()["feature_manifest_hash"]


@pytest.mark.slow
def test_changed_story_texts_change_the_feature_hash(dataset_copy, store_copy):
    before = _hash(dataset_copy, store_copy)
    store = FeatureStore(store_copy)
    sessions = sorted(load_dataset(dataset_copy).sessions.index)
    session_part = store.manifest_hash(sessions, ["audio", "text"])
    stories = pd.read_csv(dataset_copy / "stories.csv")
    stories.loc[0, "text"] = stories.loc[0, "text"] + " Then the rain stopped."
    stories.to_csv(dataset_copy / "stories.csv", index=False)
    report = extract_features(load_dataset(dataset_copy), store, ["audio", "text"], FEATURES_CFG, progress=False)
    assert report.extracted == [(DATASET_KEY, "stories")]  # only the story embeddings were redone
    store = FeatureStore(store_copy)
    assert store.manifest_hash(sessions, ["audio", "text"]) == session_part
    after = _hash(dataset_copy, store_copy)
    assert after != before
    assert after == feature_manifest_hash(store, sessions, ["audio", "text"])
