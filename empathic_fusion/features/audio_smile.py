"""openSMILE low-level descriptors averaged onto the video frame clock.

ComParE_2016 LLDs (65 per 10 ms frame, the paper's F = 65) or eGeMAPSv02 LLDs (25). Each video
frame i covers [i / fps, (i + 1) / fps); the LLD frames starting inside it are averaged.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from empathic_fusion.features.media import FULL_SCALE, AudioTrack, MediaError, decode_audio

SAMPLE_RATE = 16000
FEATURE_SETS = {"ComParE_2016": 65, "eGeMAPSv02": 25}
# the LLD that is 0 on unvoiced frames (openSMILE's F0 tracker): the voicing fallback for the speech mask
F0_COLUMN = {"ComParE_2016": "F0final_sma", "eGeMAPSv02": "F0semitoneFrom27.5Hz_sma3nz"}


@lru_cache(maxsize=4)
def _smile(feature_set: str):
    import opensmile

    if feature_set not in FEATURE_SETS:
        raise ValueError(f"unknown openSMILE feature set '{feature_set}'; choose one of {list(FEATURE_SETS)}")
    return opensmile.Smile(feature_set=getattr(opensmile.FeatureSet, feature_set),
                           feature_level=opensmile.FeatureLevel.LowLevelDescriptors)


def extract_audio(source: Path, fps: float, feature_set: str = "ComParE_2016",
                  **_: object) -> tuple[dict, dict, list[str]]:
    """Arrays (features T x F float32, present mask T uint8, voiced T uint8), info and warnings.

    A video frame is voiced when most of its 10 ms LLD frames have an F0 (openSMILE's pitch tracker
    found voicing); the datamodule falls back to it for the speech mask when the transcript has no
    participant speech. Other config keys (the speech-mask policy) are read by the datamodule.
    Several channels are averaged (media.decode_audio); input at or near full scale is warned about.
    """
    track = decode_audio(source, SAMPLE_RATE)
    signal = track.samples
    warnings: list[str] = []
    clipping = clipping_warning(source, track)
    if clipping:
        warnings.append(clipping)
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
    voiced_lld = (lld[F0_COLUMN[feature_set]].to_numpy() > 0).astype(np.float64)
    voiced_sum = np.zeros(n_frames)
    np.add.at(voiced_sum, frame[keep], voiced_lld[keep])
    voiced = (voiced_sum > 0.5 * np.maximum(counts, 1)).astype(np.uint8)
    info = {"n_frames": n_frames, "seconds": len(signal) / SAMPLE_RATE, "feature_names": list(lld.columns),
            "voiced_frames": int(voiced.sum()), "channel_layout": track.layout, "channels": len(track.channels),
            "mixed_channels": list(track.mixed)}
    return ({"features": features.astype(np.float32), "mask": (counts > 0).astype(np.uint8), "voiced": voiced},
            info, warnings)


def clipping_warning(source: Path, track: AudioTrack) -> str | None:
    """The input's samples at or near full scale, counted per channel (a mean downmix adds no clipping)."""
    total = sum(track.clipped)
    if not total:
        return None
    counts = ", ".join(f"{name} ({n:,})" for name, n in zip(track.channels, track.clipped) if n)
    where = f" in channel(s) {counts}" if len(track.channels) > 1 else ""
    first, last = track.clipped_span
    return (f"{source.name}: audio clips: {total:,} sample(s) at {FULL_SCALE:.1%} of full scale or above{where}, "
            f"between {first:.1f} s and {last:.1f} s; kept as recorded, so the features of those stretches "
            f"describe the distortion (re-record with lower gain)")
