"""Self-describing checkpoints: they record modalities, dims and feature config, and refuse other dims."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from empathic_fusion.models.base import build_module
from empathic_fusion.models.checkpoints import load_module, read_header
from empathic_fusion.models.fusion_module import FusionModule, FeatureMismatchError
from empathic_fusion.pipeline import run_config
from empathic_fusion.compose import compose_config

DIMS = {"video": 6, "audio": 4, "text": 5, "story": 5, "traits": 6}
FEATURES = {"audio": {"feature_set": "ComParE_2016"}, "text": {"model_path": None}}


def _batch(dims: dict[str, int], n: int = 8, frames: int = 10, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch = {m: {"x": torch.randn(n, frames, dims[m], generator=g), "mask": torch.ones(n, frames, dtype=torch.bool),
                 "lengths": torch.full((n,), frames)} for m in ("video", "audio")}
    batch["story"] = torch.randn(n, dims["story"], generator=g)
    batch["traits"] = torch.randn(n, dims["traits"], generator=g)
    batch["traits_mask"] = torch.ones(n, dims["traits"], dtype=torch.bool)
    batch["target"] = torch.rand(n, generator=g) * 2 - 1
    batch["rating_index"] = torch.arange(n)
    return batch


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    net = {"_target_": "empathic_fusion.models.lf_lstm.LFLSTM", "hidden_sizes": {"video": 4, "audio": 4},
           "representation_dim": 8, "post_fusion_hidden": 8}
    config = {**run_config(compose_config(["model=lf_lstm"], "unused")), "features": FEATURES}
    model = build_module({**config["model"], "net": net, "head": "regression"},
                         {"modalities": ["video", "audio"], "input_dims": DIMS, "feature_manifest_hash": "abc123",
                          "split_hash": "s1", "window_frames": 10}, config)
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")
    trainer.fit(model, DataLoader([_batch(DIMS, seed=s) for s in range(2)], batch_size=None))
    path = tmp_path_factory.mktemp("ckpt") / "model.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_checkpoint_describes_what_it_was_trained_on(checkpoint):
    description = read_header(checkpoint)
    assert description["modalities"] == ["video", "audio"]
    assert description["input_dims"] == DIMS
    assert description["features"] == FEATURES
    assert description["feature_manifest_hash"] == "abc123" and description["split_hash"] == "s1"
    assert torch.load(checkpoint, weights_only=False)["empathic_fusion"] == description
    assert description["module"] == "fusion" and description["model"] == "lf_lstm" and description["format"] == 3
    assert description["created"].startswith("20") and description["commit"]
    assert isinstance(load_module(checkpoint), FusionModule)


def test_same_dims_run_and_other_dims_stop_with_a_clear_message(checkpoint):
    model = FusionModule.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=False).eval()
    with torch.no_grad():
        assert model(_batch(DIMS)).shape == (8,)
        with pytest.raises(FeatureMismatchError, match=r"video has 9 dims instead of 6.*feature config"):
            model(_batch({**DIMS, "video": 9}))
    with pytest.raises(FeatureMismatchError, match=r"modalities \['audio', 'text', 'video'\] instead of"):
        model.check_input_dims(DIMS, ["video", "audio", "text"])
    with pytest.raises(FeatureMismatchError, match="story has 7 dims instead of 5"):
        model.check_input_dims({**DIMS, "story": 7}, ["video", "audio"])
