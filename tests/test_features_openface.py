"""OpenFace importer: the real FeatureExtraction CSV becomes the face branch, success/confidence the mask."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from empathic_fusion.features.openface_import import (OPENFACE_DIM, OPENFACE_FEATURE_NAMES, OpenFaceFormatError,
                                          import_openface, read_openface_csv)
from empathic_fusion.utils import PROJECT_ROOT

REAL_CSV = PROJECT_ROOT.parent / "shared" / "data" / "media" / "OpenFace_Test.csv"
needs_real = pytest.mark.skipif(not REAL_CSV.exists(), reason="../shared/data/media is not beside the checkout")


@needs_real
def test_real_csv_values_land_on_their_frames():
    raw = read_openface_csv(REAL_CSV)
    stamps = raw.timestamp.to_numpy()
    fps = 1.0 / np.median(np.diff(stamps))  # the CSV's own rate: one row per frame
    arrays, info, warnings = import_openface(REAL_CSV, fps, min_confidence=0.5)
    features, mask = arrays["features"], arrays["mask"]
    assert features.shape == (len(raw), OPENFACE_DIM) == (100, 253) and features.dtype == np.float16
    assert mask.all() and info["valid_rows"] == 100 and not warnings
    names = list(OPENFACE_FEATURE_NAMES)
    for column in ("gaze_0_x", "pose_Tz", "pose_Rx", "AU12_r", "AU45_c"):
        np.testing.assert_allclose(features[:, names.index(column)], raw[column], rtol=2e-3, atol=2e-3)
    # 3D landmarks are centred per frame: their mean is 0, their spread is the CSV's
    x = features[:, names.index("X_0"):names.index("X_0") + 204:3].astype(np.float64)
    assert np.abs(x.mean(axis=1)).max() < 0.05
    raw_x = raw[[f"X_{i}" for i in range(68)]].to_numpy()
    np.testing.assert_allclose(x.std(axis=1), raw_x.std(axis=1), rtol=1e-2)


@needs_real
def test_success_and_confidence_become_the_mask(tmp_path):
    raw = pd.read_csv(REAL_CSV, skipinitialspace=True)
    raw.columns = raw.columns.str.strip()
    raw.loc[10:19, "success"] = 0
    raw.loc[30:34, "confidence"] = 0.2
    path = tmp_path / "session.csv"
    raw.to_csv(path, index=False)
    fps = 1000.0  # the test CSV's timestamps are 1 ms apart
    arrays, info, _ = import_openface(path, fps, min_confidence=0.75)
    mask = arrays["mask"]
    expected = np.ones(100, dtype=np.uint8)
    expected[10:20] = 0
    expected[30:35] = 0
    assert np.array_equal(mask, expected) and info["valid_rows"] == 85
    assert not np.any(arrays["features"][mask == 0])  # masked frames are zeros, never dropped
    # a threshold above every row's confidence masks everything, with a warning
    arrays, _, warnings = import_openface(path, fps, min_confidence=0.99)
    assert arrays["mask"].sum() == 0 and any("no row passes" in w for w in warnings)


@needs_real
def test_resampled_onto_the_dataset_clock_and_padded_to_the_video(tmp_path):
    raw = pd.read_csv(REAL_CSV, skipinitialspace=True)
    raw.columns = raw.columns.str.strip()
    raw["timestamp"] = np.arange(len(raw)) / 30.0  # a 30 fps recording, 3.33 s
    path = tmp_path / "s.csv"
    raw.to_csv(path, index=False)
    arrays, info, warnings = import_openface(path, 15.0, n_frames=60)
    assert arrays["features"].shape == (60, OPENFACE_DIM) and info["n_frames"] == 60
    assert arrays["mask"][:50].all() and not arrays["mask"][50:].any()  # the CSV ends at 3.33 s = frame 50
    # frame i shows row 2i (the last row at or before i / 15 s)
    au = list(OPENFACE_FEATURE_NAMES).index("AU01_r")
    np.testing.assert_allclose(arrays["features"][:50, au], raw["AU01_r"].to_numpy()[::2][:50], atol=2e-3)
    assert any("covers 50 frames" in w for w in warnings)


@needs_real
def test_a_video_that_starts_after_its_audio_puts_the_rows_after_the_lead(tmp_path):
    raw = pd.read_csv(REAL_CSV, skipinitialspace=True)
    raw.columns = raw.columns.str.strip()
    raw["timestamp"] = np.arange(len(raw)) / 15.0  # OpenFace times rows from the video's first frame
    path = tmp_path / "s.csv"
    raw.to_csv(path, index=False)
    plain, _, _ = import_openface(path, 15.0, n_frames=130)
    late, _, _ = import_openface(path, 15.0, n_frames=130, video_start_s=2.0)  # the video starts at 2 s
    assert not late["mask"][:30].any() and late["mask"][30:130].all()
    assert np.array_equal(late["features"][30:130], plain["features"][:100])


def test_csv_without_3d_landmarks_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.csv"
    pd.DataFrame({"frame": [1], "timestamp": [0.0], "confidence": [0.9], "success": [1]}).to_csv(path, index=False)
    with pytest.raises(OpenFaceFormatError, match="missing column"):
        import_openface(path, 15.0)
