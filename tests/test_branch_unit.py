"""A feature branch is one unit: a toy media branch registered in one place (its extractor and its settings,
below) is extracted into the store, sized, read by the datamodule and trained on, with no other file knowing
its name; an unknown branch is an error naming the known ones, never read as another branch."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from empathic_fusion.config import with_defaults
from empathic_fusion.config.features import FeaturesConfig, features_schema
from empathic_fusion.core.branches import BRANCHES, BranchSpec, UnknownBranchError
from empathic_fusion.dataset import load_dataset
from empathic_fusion.features.branch_unit import (BranchOutput, BranchUnit, MediaJob, branch_unit, register_branch,
                                                  unregister_branch)
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features.media import probe_video
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.features.store_space import branch_bytes

TOY_DIM = 3


@dataclass
class ToyConfig:
    """features.toy: the period of the toy's clock waves."""

    period_s: float = 2.0


def toy_signature(store, dataset, session_id: str, cfg: dict, text_identity: str | None = None) -> dict:
    return {"extractor": "toy_clock", "version": "1", "config": {"fps": dataset.fps, **cfg["toy"]},
            "inputs": {"video": store.file_hash(dataset.sessions.loc[session_id].video)}}


def toy_frame_bytes(cfg: dict) -> int:
    return TOY_DIM * 2 + 1


def extract_toy(job: MediaJob, branches: list[str]) -> dict[str, BranchOutput]:
    """Per frame of the video: a sine and a cosine of the session clock and a constant."""
    n_frames = probe_video(job.video).frames_at(job.fps)
    phase = 2 * np.pi * np.arange(n_frames) / job.fps / job.cfg["toy"]["period_s"]
    features = np.stack([np.sin(phase), np.cos(phase), np.ones(n_frames)], axis=1).astype(np.float16)
    return {"toy": ({"features": features, "mask": np.ones(n_frames, np.uint8)}, {"n_frames": n_frames}, [])}


@pytest.fixture
def toy_branch():
    unit = register_branch(BranchUnit("toy", BranchSpec("video", "media", medium="video"), ToyConfig, toy_signature,
                                      extract_media=extract_toy, frame_bytes=toy_frame_bytes))
    try:
        yield unit
    finally:
        unregister_branch("toy")


def test_a_registered_branch_has_its_settings_and_is_gone_after(toy_branch):
    assert branch_unit("toy") is toy_branch and BRANCHES["toy"].modality == "video"
    assert with_defaults({"toy": {"period_s": 4.0}})["toy"] == {"period_s": 4.0}
    assert with_defaults({"modalities": {"video": ["face", "toy"]}})["modalities"]["video"] == ["face", "toy"]
    unregister_branch("toy")
    assert "toy" not in BRANCHES and features_schema() is FeaturesConfig
    with pytest.raises(UnknownBranchError, match=r"unknown feature branch 'toy'; known: \['face', 'cnn'"):
        branch_unit("toy")


def test_an_unknown_branch_is_an_error_naming_the_known_ones(tiny_dataset, tmp_path):
    dataset = load_dataset(tiny_dataset)
    session = dataset.sessions.index[0]
    with pytest.raises(UnknownBranchError, match="unknown feature branch 'toy'; known: .*'glove'"):
        branch_bytes(dataset, session, "toy", with_defaults(None))
    with pytest.raises(UnknownBranchError, match="'toy'"):
        extract_features(dataset, FeatureStore(tmp_path / "store"), ["video"], {}, branches=["toy"], progress=False)


def test_a_toy_branch_is_extracted_sized_and_trained_on(toy_branch, tiny_dataset, tmp_path):
    from empathic_fusion.pipeline import train
    from empathic_fusion.utils.compose import compose_config

    dataset = load_dataset(tiny_dataset)
    session = dataset.sessions.index[0]
    assert branch_bytes(dataset, session, "toy", with_defaults(None)) > 100 * toy_frame_bytes({})
    store = tmp_path / "store"
    cfg = compose_config([
        f"data.dataset_dir={tiny_dataset}", f"data.store_dir={store}", "data.demo=null", "modality=v",
        "features.modalities.video=[toy]", "features.toy.period_s=3.0", "data.split_fractions=[0.6,0.2,0.2]",
        "data.extract_workers=1", "model.head=regression", "trainer.max_epochs=1", "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false", "seed=1", "evaluation=lean",
    ], tmp_path / "run", "train")
    results = train(cfg)
    assert np.isfinite(results["model"]["rating"]["mse"])
    entry = FeatureStore(store).entry(session, "toy")
    assert entry["signature"]["config"] == {"fps": dataset.fps, "period_s": 3.0}
    assert entry["arrays"]["features"]["shape"][1] == TOY_DIM
    assert FeatureStore(store).entry(session, "face") is None  # only the branch the run asked for


def test_an_unknown_branch_is_a_user_error_that_names_a_modalitys_branches_or_the_closest():
    """`extract.py branches=[video]` stops with one message, not Hydra's traceback (a UserError: cli.py)."""
    from empathic_fusion.core.errors import UserError

    assert issubclass(UnknownBranchError, UserError)
    assert str(UnknownBranchError("video")).endswith("; 'video' is a modality, its branches are ['face', 'cnn']")
    assert str(UnknownBranchError("facee")).endswith("; did you mean 'face'?")
    assert str(UnknownBranchError("zzz")).endswith("'glove']")


def test_extract_stops_at_a_mistyped_branch_before_generating_the_demo(tmp_path):
    from empathic_fusion.features.command import run_extraction
    from empathic_fusion.utils.compose import compose_config

    cfg = compose_config(["branches=[face,vidoe]", f"paths.data_dir={tmp_path / 'data'}"], tmp_path / "run", "extract")
    with pytest.raises(UnknownBranchError, match="unknown feature branch 'vidoe'"):
        run_extraction(cfg)
    assert not (tmp_path / "data").exists()  # no demo generated, no store made


def test_extract_knows_a_branch_that_an_extractor_file_of_the_package_registers_when_discovered(monkeypatch, tmp_path):
    """The early name check asks the unit registry, which first imports the package's extractor files: a branch a
    new file registers (found without an import line) passes the check like a built-in one."""
    from empathic_fusion.features import branch_unit as units
    from empathic_fusion.features import command
    from empathic_fusion.utils.compose import compose_config

    class Checked(Exception):
        """The names passed: the run went on to the demo."""

    def discover() -> None:  # stands in for a new file in empathic_fusion/features/ that registers "toy"
        register_branch(BranchUnit("toy", BranchSpec("video", "media", medium="video"), ToyConfig, toy_signature,
                                   extract_media=extract_toy, frame_bytes=toy_frame_bytes))

    def prepare_demo(cfg) -> None:
        raise Checked

    monkeypatch.setattr(units, "_discover", discover)
    monkeypatch.setattr(command, "prepare_demo", prepare_demo)
    cfg = compose_config(["branches=[face,toy]", f"paths.data_dir={tmp_path / 'data'}"], tmp_path / "run", "extract")
    try:
        with pytest.raises(Checked):
            command.run_extraction(cfg)
    finally:
        unregister_branch("toy")
