"""Reading media: video frames resampled onto the dataset's frame clock, audio as 16 kHz mono."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

from empathic_fusion.core.errors import UserError


class MediaError(UserError, RuntimeError):
    """A media file that cannot be read; the message names the file and what failed."""


@dataclass(frozen=True)
class VideoInfo:
    fps: float
    declared_frames: int  # from the container header; 0 when unknown
    width: int
    height: int

    def frames_at(self, target_fps: float) -> int:
        """Number of frames on the dataset clock covering the declared duration."""
        if self.declared_frames <= 0 or self.fps <= 0:
            return 0
        return int(math.floor(self.declared_frames / self.fps * target_fps + 1e-6))


def probe_video(path: Path) -> VideoInfo:
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise MediaError(f"cannot open video {path}")
        info = VideoInfo(fps=float(capture.get(cv2.CAP_PROP_FPS) or 0.0),
                         declared_frames=max(int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0), 0),
                         width=int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
                         height=int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)))
    finally:
        capture.release()
    if info.fps <= 0:
        raise MediaError(f"video {path} reports no frame rate")
    return info


def iter_frames(path: Path, target_fps: float) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (target_index, source_index, BGR frame) on the target clock.

    Target frame i shows the last source frame whose presentation time is at or before
    i / target_fps, so 30 fps input is decimated, slower input is held, and variable-rate input
    (per-frame timestamps from the container) lands on the right frames; time stays aligned with
    audio and text. Containers without usable timestamps fall back to index / declared fps.
    """
    info = probe_video(path)
    capture = cv2.VideoCapture(str(path))
    step = 1.0 / target_fps
    try:
        source_index, next_target, last_time = 0, 0, -math.inf
        previous: tuple[int, np.ndarray] | None = None
        while True:
            ok, frame = capture.read()
            if not ok or frame is None:
                break
            stamp = capture.get(cv2.CAP_PROP_POS_MSEC) / 1000.0
            nominal = source_index / info.fps
            # timestamps must exist and increase; otherwise trust the declared rate
            time_s = stamp if stamp >= 0 and stamp > last_time and abs(stamp - nominal) < 5.0 else nominal
            if previous is not None:
                while next_target * step < time_s - 1e-9:
                    yield next_target, previous[0], previous[1]
                    next_target += 1
            previous, last_time = (source_index, frame), time_s
            source_index += 1
        if previous is not None:  # the last frame lasts one source frame period
            while next_target * step < last_time + 1.0 / info.fps - 1e-9:
                yield next_target, previous[0], previous[1]
                next_target += 1
    finally:
        capture.release()


FULL_SCALE = 0.999  # |sample| at or above this is counted as clipped (at or near full scale)
SIGNAL_CHANNEL_RMS = 0.01  # a channel whose RMS is below this share of the loudest channel's (-40 dB) carries no signal


@dataclass(frozen=True)
class AudioTrack:
    """Decoded audio downmixed to mono, with what the downmix saw: the channels, which of them were
    averaged, and the samples at or near full scale in each (counted at the input's own rate)."""

    samples: np.ndarray            # float32 mono at the requested rate
    layout: str                    # FFmpeg's name of the input's channel layout, e.g. "5.1", "stereo", "1 channels"
    channels: tuple[str, ...]      # the input's channels, in stream order (FFmpeg names, or 1, 2, ... when unnamed)
    mixed: tuple[str, ...]         # the channels averaged into `samples`: those that carry signal
    clipped: tuple[int, ...]       # per input channel: samples with |x| >= FULL_SCALE
    clipped_span: tuple[float, float] | None  # seconds of the first and last such sample


def _channel_names(layout) -> tuple[str, ...]:
    names = [channel.name for channel in layout.channels]
    return tuple(name if name and name != "NONE" else str(i + 1) for i, name in enumerate(names))


def _full_scale_samples(frame) -> np.ndarray:
    """(channels, samples) bool of one decoded frame: |x| >= FULL_SCALE, integer formats scaled to [-1, 1)."""
    data = frame.to_ndarray()
    if not frame.format.is_planar:  # packed: one row of interleaved samples
        data = data.reshape(-1, len(frame.layout.channels)).T
    if data.dtype.kind == "f":
        level = np.abs(data)
    elif data.dtype == np.uint8:
        level = np.abs(data.astype(np.float64) - 128.0) / 128.0
    else:
        level = np.abs(data.astype(np.float64)) / (float(np.iinfo(data.dtype).max) + 1.0)
    return level >= FULL_SCALE


def decode_audio(path: Path, sample_rate: int = 16000) -> AudioTrack:
    """A wav file's or a video container's first audio stream as mono float32 at sample_rate.

    Mono input is only converted and resampled (FFmpeg via PyAV). Input with several channels is
    resampled channel by channel and averaged, never summed (FFmpeg's own downmix adds 5.1's channels
    up to 3.4x the level of one), over the channels that carry signal: those whose RMS is at least
    SIGNAL_CHANNEL_RMS of the loudest channel's. Speech in all channels, in the centre channel of 5.1
    only, or on one channel of a one-microphone stereo recording thus keeps the level it was recorded at.
    """
    import av  # here, not at the top: the video path needs no PyAV

    try:
        container = av.open(str(path))
    except Exception as error:  # noqa: BLE001 - PyAV raises several error types for unreadable files
        raise MediaError(f"cannot open audio in {path}: {error}") from error
    with container:
        if not container.streams.audio:
            raise MediaError(f"{path} has no audio stream")
        resampler, layout, channels = None, "", ()
        chunks: list[np.ndarray] = []
        clipped: np.ndarray | None = None
        first_clip = last_clip = None
        decoded = 0  # samples per channel at the input's rate so far
        try:
            for frame in container.decode(container.streams.audio[0]):
                if resampler is None:
                    layout, channels = frame.layout.name, _channel_names(frame.layout)
                    clipped = np.zeros(len(channels), dtype=np.int64)
                    # one channel: FFmpeg's mono conversion, as always (no mixing); several: kept apart, planar
                    resampler = (av.AudioResampler(format="flt", layout="mono", rate=sample_rate) if len(channels) == 1
                                 else av.AudioResampler(format="fltp", layout=frame.layout, rate=sample_rate))
                at_full_scale = _full_scale_samples(frame)
                if at_full_scale.any():
                    clipped[: len(at_full_scale)] += at_full_scale.sum(axis=1)
                    where = np.flatnonzero(at_full_scale.any(axis=0))
                    first_clip = (decoded + where[0]) / frame.sample_rate if first_clip is None else first_clip
                    last_clip = (decoded + where[-1]) / frame.sample_rate
                decoded += frame.samples
                chunks += [out.to_ndarray().reshape(len(channels), -1) for out in resampler.resample(frame)]
            if resampler is not None:
                chunks += [out.to_ndarray().reshape(len(channels), -1) for out in resampler.resample(None)]
        except av.error.FFmpegError as error:
            if not chunks:
                raise MediaError(f"cannot decode audio in {path}: {error}") from error
    if not chunks:
        raise MediaError(f"{path} contains no audio samples")
    planar = np.concatenate(chunks, axis=1).astype(np.float32)
    if len(channels) == 1:
        samples, mixed = planar[0], channels
    else:
        rms = np.sqrt(np.mean(np.square(planar, dtype=np.float64), axis=1))
        carrying = rms >= SIGNAL_CHANNEL_RMS * rms.max() if rms.max() > 0 else np.ones(len(channels), dtype=bool)
        samples = planar[carrying].mean(axis=0, dtype=np.float64).astype(np.float32)
        mixed = tuple(name for name, keep in zip(channels, carrying) if keep)
    return AudioTrack(samples=samples, layout=layout, channels=channels, mixed=mixed,
                      clipped=tuple(int(n) for n in clipped),
                      clipped_span=None if first_clip is None else (float(first_clip), float(last_clip)))


def load_audio(path: Path, sample_rate: int = 16000) -> np.ndarray:
    """Mono float32 samples at sample_rate from a wav file or a video container's first audio stream
    (channels averaged as decode_audio describes)."""
    return decode_audio(path, sample_rate).samples
