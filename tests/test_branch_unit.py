"""A feature branch is one unit: a toy media branch registered in one place (its extractor and its settings,
below) is known with its settings and forgotten after; an unknown branch is an error naming the known ones,
never read as another branch. A branch as an extractor file of the package, found before composing,
extracted and trained on: tests/test_branch_one_file.py."""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pytest

from empathic_fusion.config import with_defaults
from empathic_fusion.config.features import features_schema
from empathic_fusion.core.branches import BRANCHES, BranchSpec, UnknownBranchError
from empathic_fusion.dataset import load_dataset
from empathic_fusion.features.branch_unit import (BranchOutput, BranchUnit, MediaJob, branch_unit, register_branch,
                                                  unregister_branch)
from empathic_fusion.features.extract import extract_features
from empathic_fusion.features.media import probe_video
from empathic_fusion.features.store import FeatureStore
from empathic_fusion.features.store_space import branch_bytes
from tests.test_branch_one_file import toy_file  # noqa: F401  (the fixture: a toy extractor file in the package)

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
    assert "toy" not in BRANCHES and "toy" not in {f.name for f in fields(features_schema())}
    with pytest.raises(UnknownBranchError, match=r"unknown feature branch 'toy'; known: \['face', 'cnn'"):
        branch_unit("toy")


def test_an_unknown_branch_is_an_error_naming_the_known_ones(tiny_dataset, tmp_path):
    dataset = load_dataset(tiny_dataset)
    session = dataset.sessions.index[0]
    with pytest.raises(UnknownBranchError, match="unknown feature branch 'toy'; known: .*'glove'"):
        branch_bytes(dataset, session, "toy", with_defaults(None))
    with pytest.raises(UnknownBranchError, match="'toy'"):
        extract_features(dataset, FeatureStore(tmp_path / "store"), ["video"], {}, branches=["toy"], progress=False)


def test_an_unknown_branch_is_a_user_error_that_names_a_modalitys_branches_or_the_closest():
    """`extract.py branches=[video]` stops with one message, not Hydra's traceback (a UserError: cli.py)."""
    from empathic_fusion.core.errors import UserError

    assert issubclass(UnknownBranchError, UserError)
    assert str(UnknownBranchError("video")).endswith("; 'video' is a modality, its branches are ['face', 'cnn']")
    assert str(UnknownBranchError("facee")).endswith("; did you mean 'face'?")
    assert str(UnknownBranchError("zzz")).endswith("'glove']")


def test_extract_stops_at_a_mistyped_branch_before_generating_the_demo(tmp_path):
    from empathic_fusion.features.command import run_extraction
    from empathic_fusion.compose import compose_config

    cfg = compose_config(["branches=[face,vidoe]", f"paths.data_dir={tmp_path / 'data'}"], tmp_path / "run", "extract")
    with pytest.raises(UnknownBranchError, match="unknown feature branch 'vidoe'"):
        run_extraction(cfg)
    assert not (tmp_path / "data").exists()  # no demo generated, no store made


@pytest.mark.usefixtures("toy_file")
def test_extract_knows_a_branch_that_an_extractor_file_of_the_package_declares(tmp_path):
    """The early name check asks the unit registry, which first looks for new extractor files of the package:
    a branch a new file declares (found without an import line) passes the check like a built-in one."""
    from empathic_fusion.features import command
    from empathic_fusion.compose import compose_config

    class Checked(Exception):
        """The names passed: the run went on to the demo."""

    def prepare_demo(cfg) -> None:
        raise Checked

    cfg = compose_config(["branches=[face,toy]", f"paths.data_dir={tmp_path / 'data'}"], tmp_path / "run", "extract")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(command, "prepare_demo", prepare_demo)
        with pytest.raises(Checked):
            command.run_extraction(cfg)
