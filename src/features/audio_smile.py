"""openSMILE low-level descriptors averaged onto the video frame clock.

ComParE_2016 LLDs (65 per 10 ms frame, the paper's F = 65) or eGeMAPSv02 LLDs (25). Each video
frame i covers [i / fps, (i + 1) / fps); the LLD frames starting inside it are averaged.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from src.features.media import MediaError, load_audio

SAMPLE_RATE = 16000
FEATURE_SETS = {"ComParE_2016": 65, "eGeMAPSv02": 25}


@lru_cache(maxsize=4)
def _smile(feature_set: str):
    import opensmile

    if feature_set not in FEATURE_SETS:
        raise ValueError(f"unknown openSMILE feature set '{feature_set}'; choose one of {list(FEATURE_SETS)}")
    return opensmile.Smile(feature_set=getattr(opensmile.FeatureSet, feature_set),
                           feature_level=opensmile.FeatureLevel.LowLevelDescriptors)


def extractor_version() -> str:
    import opensmile

    return opensmile.__version__


def extract_audio(source: Path, fps: float, feature_set: str = "ComParE_2016") -> tuple[dict, dict, list[str]]:
    """Arrays (features T x F float32, present mask T uint8), info and warnings for one recording."""
    signal = load_audio(source, SAMPLE_RATE)
    warnings: list[str] = []
    peak = float(np.abs(signal).max()) if signal.size else 0.0
    if peak < 1e-4:
        warnings.append(f"{source.name}: audio is silent (peak {peak:.1e}); its features describe silence")
    smile = _smile(feature_set)
    lld = smile.process_signal(signal, SAMPLE_RATE)
    values = lld.to_numpy(dtype=np.float64)
    starts = lld.index.get_level_values("start").total_seconds().to_numpy()
    n_frames = int(math.floor(len(signal) / SAMPLE_RATE * fps + 1e-6))
    if n_frames == 0:
        raise MediaError(f"{source} is shorter than one video frame")
    frame = np.floor(starts * fps + 1e-9).astype(int)
    keep = frame < n_frames
    bad = ~np.isfinite(values)
    if bad.any():
        warnings.append(f"{source.name}: {int(bad.any(axis=1).sum())} openSMILE frames had NaN/inf values; set to 0")
        values[bad] = 0.0
    sums = np.zeros((n_frames, values.shape[1]))
    counts = np.zeros(n_frames)
    np.add.at(sums, frame[keep], values[keep])
    np.add.at(counts, frame[keep], 1)
    features = sums / np.maximum(counts, 1)[:, None]
    info = {"n_frames": n_frames, "seconds": len(signal) / SAMPLE_RATE, "feature_names": list(lld.columns)}
    return {"features": features.astype(np.float32), "mask": (counts > 0).astype(np.uint8)}, info, warnings
