"""Modalities made of several store branches (video = face + cnn, text = SBERT + GloVe), the speech
mask's voicing fallback, and the `features` configs (default, paper) and the extract command's config."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from empathic_fusion.dataset import load_dataset
from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
from empathic_fusion.features.speech import speech_mask
from empathic_fusion.config import with_defaults
from empathic_fusion.features.extract import branch_signature, extract_features, parse_shard
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.utils import CONFIG_DIR
from tests.conftest import FEATURES_CFG

CNN_DIM = 8


def _plant_cnn(store: FeatureStore, dataset, cfg: dict) -> None:
    """A stand-in CNN branch (the real one is too slow for the suite on CPU): row t of session s holds
    t + s_index in every column, and every 4th frame has no embedding (mask 0). It is recorded with the
    signature a real extraction would record, so the datamodule sees it as fresh."""
    for i, sid in enumerate(dataset.sessions.index):
        signature = branch_signature(store, dataset, sid, "cnn", with_defaults(cfg))
        n = int(store.entry(sid, "face")["n_frames"])
        features = np.repeat((np.arange(n, dtype=np.float32) + i)[:, None], CNN_DIM, axis=1)
        mask = (np.arange(n) % 4 != 0).astype(np.uint8)
        store.write_branch(sid, "cnn", {"features": features.astype(np.float16), "mask": mask},
                           signature, {"n_frames": n})


def test_video_is_face_plus_cnn_and_text_is_sbert_plus_glove(tiny_dataset, store_copy):
    store = FeatureStore(store_copy)
    dataset = load_dataset(tiny_dataset)
    cfg = {**FEATURES_CFG, "modalities": {"video": ["face", "cnn"], "audio": ["audio"], "text": ["text", "glove"]}}
    _plant_cnn(store, dataset, cfg)
    report = extract_features(dataset, store, ["text"], cfg, progress=False)
    assert sorted({b for _, b in report.extracted}) == ["glove"]  # SBERT was fresh; only GloVe was missing
    dm = FusionDataModule(str(tiny_dataset), str(store_copy), ["video", "text"], cfg, batch_size=4, extract_workers=1)
    dm.setup("fit")
    assert dm.input_dims["video"] == 1451 + CNN_DIM and dm.input_dims["text"] == 384 + 50
    data = dm.datasets["train"]
    item = data[0]
    window = data.windows.iloc[0]
    sid, start = window.session_id, int(window.start)
    video, mask = item["video"]["x"].numpy(), item["video"]["mask"].numpy()
    cnn_mask = store.load(sid, "cnn", "mask")[start:start + 120] > 0
    face_mask = store.load(sid, "face", "mask")[start:start + 120] > 0
    assert np.array_equal(mask, cnn_mask | face_mask)
    mean, std = dm.stats["video"]
    raw = np.asarray(store.load(sid, "cnn", "features")[start:start + 120], dtype=np.float32)
    expected = np.where(cnn_mask[:, None], (raw - mean[1451:]) / std[1451:], 0.0)
    np.testing.assert_allclose(video[:, 1451:], expected, atol=1e-4)  # cnn part: z-scored, zero where it has none
    text = item["text"]["x"].numpy()
    index = store.load(sid, "glove", "frame_word")[start:start + 120]
    words = store.load(sid, "glove", "words")
    np.testing.assert_allclose(text[index >= 0, 384:], words[index[index >= 0]].astype(np.float32))
    assert not text[index < 0, 384:].any()
    # one branch missing for a session masks that part only
    first = dataset.sessions.index[0]
    (store_copy / "sessions" / first / "cnn" / "mask.npy").unlink()
    dm = FusionDataModule(str(tiny_dataset), str(store_copy), ["video"], cfg, batch_size=4, extract_workers=1)
    dm.setup("fit")
    # the warning names the file that went missing, not just the branch
    assert any(first in w and "mask.npy: is missing" in w and "the cnn part of video is masked" in w
               for w in dm.warnings), dm.warnings


def test_speech_mask_falls_back_to_voicing():
    transcript = pd.DataFrame({"start": [1.0], "end": [2.0], "speaker": ["agent"], "text": ["hi"]})
    voiced = np.array([0, 1, 1, 0, 1] * 6, dtype=np.uint8)
    assert np.array_equal(speech_mask(transcript, 30, 10.0, voiced), voiced > 0)  # nobody transcribed: voicing
    assert not speech_mask(transcript, 30, 10.0, voiced, "transcript").any()
    spoken = pd.DataFrame({"start": [1.0], "end": [2.0], "speaker": ["participant"], "text": ["hi"]})
    mask = speech_mask(spoken, 30, 10.0, voiced)
    assert mask[10:20].all() and mask.sum() == 10  # the transcript wins when it has participant speech
    assert np.array_equal(speech_mask(spoken, 30, 10.0, voiced, "voicing"), voiced > 0)
    with pytest.raises(ValueError, match="speech_mask"):
        speech_mask(spoken, 30, 10.0, voiced, "loudness")


@pytest.mark.parametrize("option", ["default", "paper"])
def test_features_configs_compose(option, tmp_path):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"features={option}"])
        extract = compose(config_name="extract", overrides=[f"features={option}", "shard=3/16", "modality=v+t"])
    features = with_defaults(OmegaConf.to_container(cfg.features, resolve=True))
    expected = {"default": (["face"], ["text"]), "paper": (["face", "cnn"], ["text", "glove"])}[option]
    assert (features["modalities"]["video"], features["modalities"]["text"]) == expected
    assert features["cnn"]["model"] == "efficientnet_lite0" and features["audio"]["feature_set"] == "ComParE_2016"
    dm = FusionDataModule("/x", str(tmp_path), ["video", "audio", "text"], features)
    assert dm.branches["video"] == expected[0]
    assert parse_shard(extract.shard) == (3, 16) and list(extract.modality.names) == ["video", "text"]


def test_bad_branch_choices_are_clear_errors():
    with pytest.raises(ValueError, match=re.escape("features.modalities.video=['glove']: must be one or more of")):
        with_defaults({"modalities": {"video": ["glove"]}})
    with pytest.raises(ValueError, match="i/n"):
        parse_shard("three")
