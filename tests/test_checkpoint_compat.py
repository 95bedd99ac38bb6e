"""Checkpoints written before models had registered names (header format 2: dotted class paths, and
the text encoder at its old path empathic_fusion.text.encoder) still load, through the registry's
aliases, and predict what they predicted under the code that wrote them (tests/data/format2)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from empathic_fusion.core.registry import class_path, model_class, refresh_targets, register_model, registered_name
from empathic_fusion.models.checkpoints import WrongKindError, load_module, read_checkpoint, read_header
from empathic_fusion.models.fusion_module import FusionModule
from empathic_fusion.models.text_module import TextEmpathyModule
from empathic_fusion.scoring.text import TextScorer

DATA = Path(__file__).parent / "data" / "format2"
EXPECTED = json.loads((DATA / "expected.json").read_text())


def _batch() -> dict:
    """The batch the expected fusion predictions were computed on (same seed and shapes)."""
    g = torch.Generator().manual_seed(0)
    n, frames = 3, 12
    return {"text": {"x": torch.randn(n, frames, 384, generator=g), "mask": torch.ones(n, frames, dtype=torch.bool),
                     "lengths": torch.full((n,), frames)},
            "story": torch.randn(n, 384, generator=g), "traits": torch.zeros(n, 6),
            "traits_mask": torch.zeros(n, 6, dtype=torch.bool)}


def test_format2_headers_read_as_registered_names():
    fusion = read_header(DATA / "fusion_lf_lstm.ckpt")
    assert fusion["format"] == 2 and fusion["class"] == EXPECTED["fusion_header_class"]
    assert fusion["module"] == "fusion" and fusion["model"] == "lf_lstm"
    text = read_header(DATA / "text_regressor.ckpt")
    assert text["module"] == "text" and text["model"] == "text_regressor"


def test_a_format2_fusion_checkpoint_loads_and_predicts_as_before():
    module = load_module(DATA / "fusion_lf_lstm.ckpt", kind="fusion").eval()
    assert isinstance(module, FusionModule) and module.kind == "fusion"
    with torch.no_grad():
        pred = module(_batch())
    assert pred.tolist() == pytest.approx(EXPECTED["fusion_predictions"], abs=1e-6)


def test_a_format2_text_checkpoint_with_the_encoder_at_its_old_path_loads_and_scores_as_before():
    hparams = read_checkpoint(DATA / "text_regressor.ckpt")["hyper_parameters"]
    assert hparams["net"]["encoder"]["_target_"] == "empathic_fusion.text.encoder.SentenceEncoder"  # moved since
    scorer = TextScorer.load(DATA / "text_regressor.ckpt")
    assert isinstance(scorer.module, TextEmpathyModule)
    scores = scorer.score({"text": EXPECTED["texts"]})
    for label, values in EXPECTED["text_scores"].items():
        assert scores[label].tolist() == pytest.approx(values, abs=1e-4)


def test_the_loader_refuses_another_kind_and_says_what_it_is():
    with pytest.raises(WrongKindError, match="is a text checkpoint, not a fusion one"):
        load_module(DATA / "text_regressor.ckpt", kind="fusion")


def test_a_renamed_class_is_found_by_its_earlier_path():
    @register_model("test_renamed_net", aliases=("somewhere.old.OldNet",))
    class NewNet(torch.nn.Module):
        pass

    assert registered_name("somewhere.old.OldNet") == "test_renamed_net" and model_class("somewhere.old.OldNet") is NewNet
    config = {"net": {"_target_": "somewhere.old.OldNet", "width": 3}, "other": [{"_target_": "not.Registered"}]}
    assert refresh_targets(config) == {"net": {"_target_": class_path(NewNet), "width": 3},
                                       "other": [{"_target_": "not.Registered"}]}
    with pytest.raises(KeyError, match="not a registered model"):
        model_class("nothing.Here")


def test_a_format2_checkpoints_feature_config_with_the_renamed_cnn_half_key_still_builds_its_data(tmp_path):
    """Its run config says features.cnn.half (now features.cnn.precision): scoring new data with it
    builds the predict datamodule, reading half as the precision it meant."""
    from empathic_fusion.config import with_defaults
    from empathic_fusion.scoring.fusion import predict_datamodule

    module = load_module(DATA / "fusion_lf_lstm.ckpt", kind="fusion")
    saved = module.hparams.run_config["features"]
    assert saved["cnn"]["half"] == "auto"
    assert with_defaults(saved)["cnn"]["precision"] == "auto"
    datamodule = predict_datamodule(module, tmp_path / "dataset", tmp_path / "store")
    assert datamodule.predict and datamodule.branches == {"text": ["text"]}
