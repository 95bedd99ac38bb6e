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


def load_audio(path: Path, sample_rate: int = 16000) -> np.ndarray:
    """Mono float32 samples at sample_rate from a wav file or a video container's first audio stream."""
    import av  # here, not at the top: the video path needs no PyAV

    try:
        container = av.open(str(path))
    except Exception as error:  # noqa: BLE001 - PyAV raises several error types for unreadable files
        raise MediaError(f"cannot open audio in {path}: {error}") from error
    with container:
        if not container.streams.audio:
            raise MediaError(f"{path} has no audio stream")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
        chunks = []
        try:
            for frame in container.decode(container.streams.audio[0]):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
        except av.error.FFmpegError as error:
            if not chunks:
                raise MediaError(f"cannot decode audio in {path}: {error}") from error
    if not chunks:
        raise MediaError(f"{path} contains no audio samples")
    return np.concatenate(chunks).astype(np.float32)
