"""openSMILE low-level descriptors averaged onto the video frame clock.

ComParE_2016 LLDs (65 per 10 ms frame, the paper's F = 65) or eGeMAPSv02 LLDs (25). Each video
frame i covers [i / fps, (i + 1) / fps) of the session clock (media.session_origin); the LLD frames
starting inside it are averaged.

Memory does not grow with the recording's length beyond the per-frame outputs: the audio is decoded as a
stream (media.AudioStream) and openSMILE runs on chunks of CHUNK_SECONDS, each with CONTEXT_BEFORE_SECONDS
and CONTEXT_AFTER_SECONDS of the neighbouring audio around it; only the LLD frames starting inside the
chunk itself are kept. The LLDs' smoothing (_sma), deltas (_de), the pitch tracker's Viterbi smoothing and
the RASTA filter (an IIR filter: the longest memory) then see what they see in one call over the whole
signal. Measured with 30 s chunks on 3 minutes of the ARCTIC sentence looped, the same overlapped with
itself and noise, and a gliding tone: with 2 s of context before, ComParE's RASTA bands differ from one
call's by up to 3e-6 relative; with 3 s by up to 2e-7 (two of the three signals); from 5 s on, and for
eGeMAPS from 1 s on, not at all. 10 s leaves a margin; tests/test_audio_stream.py checks bit equality.
A recording shorter than one chunk and its context after is one call, as before.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from empathic_fusion.config.checks import one_of, require
from empathic_fusion.core.branches import BranchSpec
from empathic_fusion.core.versions import installed_version
from empathic_fusion.dataset import EmpathyDataset
from empathic_fusion.features.branch_unit import BranchOutput, BranchUnit, MediaJob, register_branch
from empathic_fusion.features.media import FULL_SCALE, AudioStream, AudioTrack, MediaError, late_start_note
from empathic_fusion.features.store import FeatureStore

AUDIO_VERSION = "4"  # 2: adds the per-frame voiced array; 3: several channels are averaged (over those carrying
# signal), not summed by FFmpeg's downmix (5.1 was 3.4x too loud, stereo up to 1.4x); mono input is unchanged.
# 4: samples placed on the session clock by the streams' start times (audio starting late is masked until it
# starts); openSMILE in chunks (equal to one call); the source sample rate recorded
SAMPLE_RATE = 16000
FEATURE_SETS = {"ComParE_2016": 65, "eGeMAPSv02": 25}
# the LLD that is 0 on unvoiced frames (openSMILE's F0 tracker): the voicing fallback for the speech mask
F0_COLUMN = {"ComParE_2016": "F0final_sma", "eGeMAPSv02": "F0semitoneFrom27.5Hz_sma3nz"}
HOP_SAMPLES = SAMPLE_RATE // 100  # both feature sets' LLD step: 10 ms; chunks start on it
CHUNK_SECONDS = 60.0  # audio per openSMILE call; with the context: 71 s, 4.5 MB of samples
CONTEXT_BEFORE_SECONDS = 10.0
CONTEXT_AFTER_SECONDS = 1.0
NANOSECONDS_PER_SAMPLE = 1_000_000_000 // SAMPLE_RATE  # 62,500: exact
SPEECH_MASKS = ("transcript", "voicing", "transcript_or_voicing")


@dataclass
class AudioConfig:
    """openSMILE low-level descriptors, averaged onto the video frame clock."""

    feature_set: str = "ComParE_2016"       # 65 LLDs (paper); eGeMAPSv02 gives 25
    speech_mask: str = "transcript_or_voicing"  # voicing is used when no participant speech is transcribed

    def __post_init__(self) -> None:
        require("features.audio", self, {"speech_mask": (self.speech_mask in SPEECH_MASKS, one_of(SPEECH_MASKS))})


@lru_cache(maxsize=4)
def _smile(feature_set: str):
    import opensmile

    if feature_set not in FEATURE_SETS:
        raise ValueError(f"unknown openSMILE feature set '{feature_set}'; choose one of {list(FEATURE_SETS)}")
    return opensmile.Smile(feature_set=getattr(opensmile.FeatureSet, feature_set),
                           feature_level=opensmile.FeatureLevel.LowLevelDescriptors)


def _hops(seconds: float) -> int:
    """`seconds` as samples, a whole number of LLD steps."""
    return int(round(seconds * SAMPLE_RATE / HOP_SAMPLES)) * HOP_SAMPLES


def chunk_windows(blocks: Iterator[np.ndarray], chunk_seconds: float = CHUNK_SECONDS,
                  before_seconds: float = CONTEXT_BEFORE_SECONDS,
                  after_seconds: float = CONTEXT_AFTER_SECONDS) -> Iterator[tuple[np.ndarray, int, int, int | None]]:
    """(window, its first sample, keep_from, keep_to) from a stream of mono blocks: the LLD frames starting
    at samples keep_from <= s < keep_to (None: to the end) of a window are the chunk's own.

    Windows are [chunk start - before, chunk end + after), cut at the signal's ends; chunks start on the LLD
    step. A chunk is only cut when at least `after` of signal follows it, so the last chunk is as long as
    that; a signal shorter than one chunk and its context after is one window: the whole signal.
    """
    chunk, before, after = _hops(chunk_seconds), _hops(before_seconds), _hops(after_seconds)
    if chunk <= 0:
        raise ValueError(f"chunk_seconds must be at least {HOP_SAMPLES / SAMPLE_RATE} s, got {chunk_seconds}")
    pending: list[np.ndarray] = []
    held_from, held = 0, 0  # the first sample held, and how many
    start = 0  # the next chunk's first sample
    for block in blocks:
        pending.append(block)
        held += len(block)
        while held_from + held >= start + chunk + after:
            buffer = np.concatenate(pending) if len(pending) > 1 else pending[0]
            first = max(start - before, 0)
            yield buffer[first - held_from:start + chunk + after - held_from], first, start, start + chunk
            start += chunk
            keep = max(start - before, 0)  # what the next window needs
            pending, held, held_from = [buffer[keep - held_from:]], held_from + held - keep, keep
    if held_from + held > start:
        buffer = np.concatenate(pending) if len(pending) > 1 else pending[0]
        first = max(start - before, 0)
        yield buffer[first - held_from:], first, start, None


class _FrameMeans:
    """Per-video-frame means of the LLD frames starting in each, built chunk by chunk in time order.

    Sums are float64 and added in LLD order (np.add.at), as one call over the whole signal adds them; the
    frames a later chunk cannot reach are finished as float32 rows at once, so only the last frame's sums
    are carried between chunks."""

    def __init__(self, width: int):
        self.done = 0  # frames finished
        self.carry = np.zeros(width)  # sums of frame `done`, open
        self.carry_count = 0.0
        self.carry_voiced = 0.0
        self.features: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.voiced: list[np.ndarray] = []

    def add(self, frames: np.ndarray, values: np.ndarray, voiced: np.ndarray) -> None:
        """LLD rows (values, voiced 0/1) on the given, non-decreasing frames (>= the frames added before)."""
        if not len(frames):
            return
        size = int(frames[-1]) - self.done + 1
        sums, counts, voiced_sum = np.zeros((size, values.shape[1])), np.zeros(size), np.zeros(size)
        sums[0], counts[0], voiced_sum[0] = self.carry, self.carry_count, self.carry_voiced
        local = frames - self.done
        np.add.at(sums, local, values)
        np.add.at(counts, local, 1)
        np.add.at(voiced_sum, local, voiced)
        self._finish(sums[:-1], counts[:-1], voiced_sum[:-1])
        self.carry, self.carry_count, self.carry_voiced = sums[-1], counts[-1], voiced_sum[-1]
        self.done += size - 1

    def _finish(self, sums: np.ndarray, counts: np.ndarray, voiced_sum: np.ndarray) -> None:
        self.features.append((sums / np.maximum(counts, 1)[:, None]).astype(np.float32))
        self.masks.append((counts > 0).astype(np.uint8))
        self.voiced.append((voiced_sum > 0.5 * np.maximum(counts, 1)).astype(np.uint8))

    def arrays(self, n_frames: int) -> dict[str, np.ndarray]:
        """features (n_frames x F float32), mask and voiced (n_frames uint8): LLDs past n_frames left out,
        frames without any LLD zero with mask 0."""
        self._finish(self.carry[None], np.array([self.carry_count]), np.array([self.carry_voiced]))
        width = self.carry.shape[0]
        features = np.concatenate(self.features)[:n_frames]
        mask, voiced = np.concatenate(self.masks)[:n_frames], np.concatenate(self.voiced)[:n_frames]
        self.features, self.masks, self.voiced = [], [], []
        if len(features) < n_frames:
            missing = n_frames - len(features)
            features = np.concatenate([features, np.zeros((missing, width), dtype=np.float32)])
            mask = np.concatenate([mask, np.zeros(missing, dtype=np.uint8)])
            voiced = np.concatenate([voiced, np.zeros(missing, dtype=np.uint8)])
        return {"features": features, "mask": mask, "voiced": voiced}


def extract_audio(source: Path, fps: float, feature_set: str = "ComParE_2016",
                  chunk_seconds: float = CHUNK_SECONDS, **_: object) -> tuple[dict, dict, list[str]]:
    """Arrays (features T x F float32, present mask T uint8, voiced T uint8), info and warnings.

    A video frame is voiced when most of its 10 ms LLD frames have an F0 (openSMILE's pitch tracker
    found voicing); the datamodule falls back to it for the speech mask when the transcript has no
    participant speech. Other config keys (the speech-mask policy) are read by the datamodule.
    Several channels are averaged (media.AudioStream); input at or near full scale, recorded below
    16 kHz, or starting after the video (its leading frames masked) is warned about. openSMILE runs on
    chunks of chunk_seconds (module docstring), so memory does not grow with the recording's length.
    """
    stream = AudioStream(source, SAMPLE_RATE, fps)
    smile = _smile(feature_set)
    means: _FrameMeans | None = None
    names: list[str] = []
    peak, bad_rows, samples = 0.0, 0, 0

    def counted(blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        nonlocal peak, samples
        for block in blocks:
            peak = max(peak, float(np.abs(block).max()) if block.size else 0.0)
            samples += len(block)
            yield block

    for window, first, keep_from, keep_to in chunk_windows(counted(stream.blocks()), chunk_seconds):
        lld = smile.process_signal(window, SAMPLE_RATE)
        if means is None:
            names, means = list(lld.columns), _FrameMeans(len(lld.columns))
        # LLD start times in ns of the signal (exact integers): which chunk a frame belongs to; then in session
        # seconds the way one call's index gives them (pandas' total_seconds), so frames fall where they did
        start_ns = lld.index.get_level_values("start").asi8 + first * NANOSECONDS_PER_SAMPLE
        keep = start_ns >= keep_from * NANOSECONDS_PER_SAMPLE
        if keep_to is not None:
            keep &= start_ns < keep_to * NANOSECONDS_PER_SAMPLE
        session_ns = start_ns[keep] + stream.start_samples * NANOSECONDS_PER_SAMPLE
        starts = pd.to_timedelta(session_ns, unit="ns").total_seconds().to_numpy()
        values = lld.to_numpy(dtype=np.float64)[keep]
        bad = ~np.isfinite(values)
        if bad.any():
            bad_rows += int(bad.any(axis=1).sum())
            values[bad] = 0.0
        voiced_lld = (lld[F0_COLUMN[feature_set]].to_numpy()[keep] > 0).astype(np.float64)
        means.add(np.floor(starts * fps + 1e-9).astype(int), values, voiced_lld)
    n_frames = int(math.floor((stream.start_samples + samples) / SAMPLE_RATE * fps + 1e-6))
    if n_frames == 0 or means is None:
        raise MediaError(f"{source} is shorter than one video frame")
    arrays = means.arrays(n_frames)
    warnings: list[str] = []
    clipping = clipping_warning(source, stream)
    if clipping:
        warnings.append(clipping)
    if peak < 1e-4:
        warnings.append(f"{source.name}: audio is silent (peak {peak:.1e}); its features describe silence")
    narrowband = narrowband_warning(source, stream.source_rate)
    if narrowband:
        warnings.append(narrowband)
    leading = int(np.argmax(arrays["mask"])) if arrays["mask"].any() else 0
    if stream.start_samples and leading:
        warnings.append(f"{source.name}: " + late_start_note("audio", stream.start, leading, "audio"))
    if bad_rows:
        warnings.append(f"{source.name}: {bad_rows} openSMILE frames had NaN/inf values; set to 0")
    info = {"n_frames": n_frames, "seconds": samples / SAMPLE_RATE, "feature_names": names,
            "voiced_frames": int(arrays["voiced"].sum()), "channel_layout": stream.layout,
            "channels": len(stream.channels), "mixed_channels": list(stream.mixed),
            "source_sample_rate": stream.source_rate, "start_seconds": round(stream.start, 6)}
    return arrays, info, warnings


def narrowband_warning(source: Path, source_rate: int) -> str | None:
    """Audio recorded below openSMILE's 16 kHz: the bands above its Nyquist frequency hold nothing."""
    if not 0 < source_rate < SAMPLE_RATE:
        return None
    kind = " (narrowband)" if source_rate <= 8000 else ""
    return (f"{source.name}: audio recorded at {source_rate} Hz{kind}: the bands above {source_rate / 2:g} Hz "
            f"(of the {SAMPLE_RATE // 2} Hz openSMILE analyses) are empty, so the spectral features there describe "
            f"nothing; resampled to {SAMPLE_RATE} Hz and kept")


def clipping_warning(source: Path, track: AudioTrack | AudioStream) -> str | None:
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


def audio_signature(store: FeatureStore, dataset: EmpathyDataset, session_id: str, cfg: dict,
                    text_identity: str | None = None) -> dict:
    """The audio branch's signature for a session: the openSMILE version and feature set, the audio's hash."""
    session = dataset.sessions.loc[session_id]
    return {"extractor": "opensmile_lld", "version": f"{AUDIO_VERSION}/opensmile-{installed_version('opensmile')}",
            "config": {"fps": dataset.fps, "feature_set": cfg["audio"]["feature_set"]},
            "inputs": {"audio": store.file_hash(session.audio or session.video)}}


def audio_frame_bytes(cfg: dict) -> int:
    """An audio frame's stored bytes: its float32 LLDs (the widest set for another one), mask and voiced bytes."""
    return FEATURE_SETS.get(cfg["audio"]["feature_set"], max(FEATURE_SETS.values())) * 4 + 2


def extract_audio_branch(job: MediaJob, branches: list[str]) -> dict[str, BranchOutput]:
    """The session's audio branch (its audio file, else its video's sound)."""
    return {"audio": extract_audio(job.audio, job.fps, job.cfg["audio"]["feature_set"])}


register_branch(BranchUnit("audio", BranchSpec("audio", "media", medium="audio", speech_source=True), AudioConfig,
                           audio_signature, extract_media=extract_audio_branch, frame_bytes=audio_frame_bytes))
