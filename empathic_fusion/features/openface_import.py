"""Import OpenFace 2 `FeatureExtraction` CSVs as the face branch: the paper's exact visual features.

EmpathicStories++ used OpenFace's normalised gaze direction, head location, 3D landmarks and facial
action units. OpenFace is not installable offline, so users who run it themselves point
`features.face.openface_dir` at a folder of `<session_id>.csv` files and the face branch reads them
instead of running MediaPipe. Layout of one frame's vector (OPENFACE_FEATURE_NAMES names each):
  gaze (8):        gaze_0_x/y/z, gaze_1_x/y/z (unit gaze vectors per eye), gaze_angle_x/y (radians;
                   computed from the mean gaze vector as OpenFace does when the CSV lacks them)
  pose (6):        pose_Tx/Ty/Tz (mm, head location), pose_Rx/Ry/Rz (radians)
  landmarks (204): 68 x (X, Y, Z) 3D landmarks in mm, centred on their mean (head location is in pose)
  AU intensity (17): AU*_r, 0-5
  AU presence (18):  AU*_c, 0/1
= 253 per frame. A row counts (mask 1) when `success` is 1 and `confidence` >= min_confidence;
other frames are zeros with mask 0. Rows are placed on the dataset clock by their `timestamp`
(frame i shows the last row at or before i / fps), the same rule as video decoding.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from empathic_fusion.core.errors import UserError

GAZE_COLUMNS = [f"gaze_{eye}_{axis}" for eye in (0, 1) for axis in "xyz"] + ["gaze_angle_x", "gaze_angle_y"]
POSE_COLUMNS = ["pose_Tx", "pose_Ty", "pose_Tz", "pose_Rx", "pose_Ry", "pose_Rz"]
N_LANDMARKS = 68
LANDMARK_COLUMNS = [f"{axis}_{i}" for i in range(N_LANDMARKS) for axis in "XYZ"]
AU_INTENSITIES = ["AU01", "AU02", "AU04", "AU05", "AU06", "AU07", "AU09", "AU10", "AU12", "AU14", "AU15",
                  "AU17", "AU20", "AU23", "AU25", "AU26", "AU45"]
AU_PRESENCES = AU_INTENSITIES[:-1] + ["AU28", "AU45"]
AU_COLUMNS = [f"{au}_r" for au in AU_INTENSITIES] + [f"{au}_c" for au in AU_PRESENCES]
OPENFACE_FEATURE_NAMES = GAZE_COLUMNS + POSE_COLUMNS + LANDMARK_COLUMNS + AU_COLUMNS
OPENFACE_DIM = len(OPENFACE_FEATURE_NAMES)
REQUIRED = ["timestamp", "confidence", "success"] + GAZE_COLUMNS[:6] + POSE_COLUMNS + LANDMARK_COLUMNS + AU_COLUMNS


class OpenFaceFormatError(UserError, ValueError):
    """An OpenFace CSV without the columns the face branch needs; the message lists them."""


def read_openface_csv(path: Path) -> pd.DataFrame:
    """The CSV with stripped column names (OpenFace writes ', ' separators), checked for needed columns."""
    table = pd.read_csv(path, skipinitialspace=True)
    table.columns = table.columns.str.strip()
    missing = [c for c in REQUIRED if c not in table.columns]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise OpenFaceFormatError(f"{path} is not an OpenFace FeatureExtraction CSV with 3D landmarks and AUs: "
                                  f"missing column(s) {shown} (run FeatureExtraction with -3Dfp -pose -gaze -aus)")
    if "gaze_angle_x" not in table.columns:  # older OpenFace: angles from the mean of both eyes' vectors
        mean = (table[GAZE_COLUMNS[0:3]].to_numpy() + table[GAZE_COLUMNS[3:6]].to_numpy()) / 2
        angles = pd.DataFrame({"gaze_angle_x": np.arctan2(mean[:, 0], -mean[:, 2]),
                               "gaze_angle_y": np.arctan2(mean[:, 1], -mean[:, 2])}, index=table.index)
        table = pd.concat([table, angles], axis=1)
    return table


def openface_rows(table: pd.DataFrame, min_confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """(rows x OPENFACE_DIM float32 features, rows bool valid) with landmarks centred per row."""
    values = table[OPENFACE_FEATURE_NAMES].to_numpy(dtype=np.float64)
    start = len(GAZE_COLUMNS) + len(POSE_COLUMNS)
    landmarks = values[:, start:start + 3 * N_LANDMARKS].reshape(len(values), N_LANDMARKS, 3)
    values[:, start:start + 3 * N_LANDMARKS] = (landmarks - landmarks.mean(axis=1, keepdims=True)).reshape(len(values), -1)
    valid = (table["success"].to_numpy() == 1) & (table["confidence"].to_numpy(dtype=np.float64) >= min_confidence)
    valid &= np.isfinite(values).all(axis=1)
    values[~valid] = 0.0
    return values.astype(np.float32), valid


def import_openface(path: Path, fps: float, n_frames: int | None = None,
                    min_confidence: float = 0.75, video_start_s: float = 0.0) -> tuple[dict, dict, list[str]]:
    """Arrays (features T x OPENFACE_DIM float16, mask T uint8), info and warnings for one session.

    n_frames (the session's length on the dataset clock, e.g. from its video) fixes T; without it T
    covers the CSV's last timestamp plus one source frame. OpenFace times its rows from the video's first
    frame; video_start_s (media.VideoInfo.lead: a video that starts after its container's audio) puts them
    on the session clock, so the frames before the video are masked as the face branch masks them.
    """
    table = read_openface_csv(Path(path))
    if table.empty:
        raise OpenFaceFormatError(f"{path} has no rows")
    rows, valid = openface_rows(table, min_confidence)
    stamps = table["timestamp"].to_numpy(dtype=np.float64)
    if np.any(np.diff(stamps) < 0):
        raise OpenFaceFormatError(f"{path}: timestamps are not sorted")
    stamps = stamps + video_start_s
    period = float(np.median(np.diff(stamps))) if len(stamps) > 1 else 1.0 / fps
    covered = int(math.ceil((stamps[-1] + period) * fps - 1e-6))  # frames starting before the CSV ends
    total = int(n_frames) if n_frames else covered
    warnings = []
    if n_frames and abs(covered - n_frames) > max(1, 0.05 * n_frames):
        warnings.append(f"{Path(path).name} covers {covered} frames but the session has {n_frames}; "
                        f"frames beyond the CSV are masked")
    # frame i shows the last row whose timestamp is at or before i / fps (held while the row lasts)
    times = np.arange(total) / fps
    source = np.searchsorted(stamps, times + 1e-9, side="right") - 1
    inside = (source >= 0) & (times < stamps[-1] + period - 1e-9)
    features = np.zeros((total, OPENFACE_DIM), dtype=np.float32)
    mask = np.zeros(total, dtype=np.uint8)
    take = np.flatnonzero(inside)
    features[take] = rows[source[take]]
    mask[take] = valid[source[take]]
    if not mask.any():
        warnings.append(f"{Path(path).name}: no row passes success=1 and confidence >= {min_confidence}; "
                        f"face features are masked")
    info = {"n_frames": total, "rows": int(len(table)), "valid_rows": int(valid.sum()),
            "face_frames": int(mask.sum()), "source_fps": 1.0 / period if period > 0 else 0.0}
    return {"features": features.astype(np.float16), "mask": mask}, info, warnings
