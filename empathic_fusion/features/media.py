"""Reading media: video frames resampled onto the dataset's frame clock, audio as 16 kHz mono."""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from empathic_fusion.core.errors import UserError


class MediaError(UserError, RuntimeError):
    """A media file that cannot be read; the message names the file and what failed."""


@dataclass(frozen=True)
class VideoInfo:
    fps: float  # average frame rate (frames / duration); variable-rate video has no other single rate
    declared_frames: int  # from the container header; 0 when unknown
    width: int
    height: int
    duration: float = 0.0  # seconds: the longer of the stream's and frames / fps (else the container's); 0: unknown

    def frames_at(self, target_fps: float) -> int:
        """Number of frames on the dataset clock covering the declared duration."""
        seconds = self.duration
        if seconds <= 0 and self.declared_frames > 0 and self.fps > 0:
            seconds = self.declared_frames / self.fps
        return int(math.floor(seconds * target_fps + 1e-6)) if seconds > 0 else 0


# Frames held back to put frames a decoder gives out of timestamp order back in order (a stream without
# reorder information: FFmpeg's "Increasing reorder buffer"). Decoders give presentation order otherwise.
REORDER_FRAMES = 8
# A frame shown longer than this (a gap in the timestamps: a recorder that stalled or dropped frames) is
# held across the gap, as a player shows it, and the gap is reported.
GAP_SECONDS = 1.0


def _open_video(path: Path):
    """(PyAV container, its video stream: the first that is not a cover picture or thumbnails); MediaError
    naming the file when it has none."""
    import av
    from av.stream import Disposition

    try:
        container = av.open(str(path))
    except Exception as error:  # noqa: BLE001 - PyAV raises several error types for unreadable files
        raise MediaError(f"cannot open video {path}: {error}") from error
    stills = Disposition.attached_pic | Disposition.timed_thumbnails
    streams = [s for s in container.streams.video if not s.disposition & stills]
    if not streams:
        container.close()
        raise MediaError(f"cannot open video {path}: it has no video stream")
    return container, streams[0]


def _video_info(path: Path, container, stream) -> VideoInfo:
    frames = max(int(stream.frames or 0), 0)
    duration = float(stream.duration * stream.time_base) if stream.duration and stream.time_base else 0.0
    rate = stream.average_rate or stream.guessed_rate
    if not rate and frames and duration > 0:
        rate = frames / duration
    fps = float(rate or 0.0)
    if fps <= 0:
        raise MediaError(f"video {path} reports no frame rate")
    # the longer of the two: a truncated AVI's stream duration is what is left, its header still counts
    # every frame (the tail is then reported as truncated); for variable-rate video they are equal
    duration = max(duration, frames / fps)
    if duration <= 0 and container.duration:  # e.g. Matroska: no per-stream duration or frame count
        duration = container.duration / 1_000_000  # AV_TIME_BASE
    context = stream.codec_context
    return VideoInfo(fps=fps, declared_frames=frames, width=int(context.width), height=int(context.height),
                     duration=duration)


def probe_video(path: Path) -> VideoInfo:
    """Frame rate, declared frames, coded size and duration from the container's header."""
    container, stream = _open_video(path)
    with container:
        return _video_info(path, container, stream)


def _decoded_frames(container, stream, problems: dict[str, int]):
    """The stream's frames in the decoder's output order. An undecodable packet is skipped (counted in
    problems["undecodable"]); a container that cannot be read further ends the stream (a truncated file)."""
    import av

    packets = container.demux(stream)
    while True:
        try:
            packet = next(packets)
        except StopIteration:
            return
        except av.error.FFmpegError:  # unreadable from here on: the frames the decoder still holds come out
            try:
                yield from stream.codec_context.decode(None)
            except av.error.FFmpegError:
                pass
            return
        try:
            frames = packet.decode()  # the last, empty packet flushes the decoder
        except av.error.FFmpegError:
            problems["undecodable"] += 1
            continue
        yield from frames


def _bgr(frame) -> np.ndarray:
    """A decoded frame as a BGR uint8 image, turned upright by the container's rotation (a phone's
    portrait video), as OpenCV shows it."""
    image = frame.to_ndarray(format="bgr24")
    turns = int(round((frame.rotation or 0) / 90)) % 4  # counter-clockwise, as np.rot90
    return np.ascontiguousarray(np.rot90(image, turns)) if turns else image


class _FramePlacer:
    """Puts source frames, given in time order, onto the target clock: target i shows the last frame whose
    time is at or before i * step. A frame is converted to an image once, and only if a target shows it."""

    def __init__(self, step: float):
        self.step = step
        self.next_target, self.source, self.time = 0, -1, -math.inf
        self.frame, self.image = None, None
        self.gaps: list[tuple[float, float]] = []  # (from, to) seconds of frames shown longer than GAP_SECONDS
        self.out_of_order = 0

    def place(self, time_s: float, frame) -> Iterator[tuple[int, int, np.ndarray]]:
        """Yield the targets the previous frame covers before time_s; then this frame is the previous one."""
        if time_s <= self.time:
            self.out_of_order += 1
            return
        if self.frame is not None:
            if time_s - self.time > GAP_SECONDS:
                self.gaps.append((self.time, time_s))
            yield from self.hold(time_s)
        self.source, self.time, self.frame, self.image = self.source + 1, time_s, frame, None

    def hold(self, until_s: float) -> Iterator[tuple[int, int, np.ndarray]]:
        """Yield the previous frame for every target before until_s."""
        while self.next_target * self.step < until_s - 1e-9:
            if self.image is None:
                self.image = _bgr(self.frame)
            yield self.next_target, self.source, self.image
            self.next_target += 1


def iter_frames(path: Path, target_fps: float,
                notes: list[str] | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (target_index, source_index, BGR frame) on the target clock.

    Target frame i shows the last source frame whose presentation time is at or before i / target_fps,
    so 30 fps input is decimated, slower input is held, and variable-rate input lands where the
    container's timestamps put it; time stays aligned with audio and text. A frame's time is its
    presentation timestamp (PyAV; exact, in the stream's time base) from the video stream's start;
    source_index counts the source frames in presentation order.

    Irregular streams are handled and, when `notes` is given, reported there: frames a decoder gives
    out of order are put back in order (up to REORDER_FRAMES apart); a frame whose time is at or before
    one already placed is left out; a frame without a timestamp is placed one frame duration after the
    frame before it (the codec's duration, else 1 / average rate: the only clock it has); a frame shown
    longer than GAP_SECONDS is held across the gap; an undecodable packet is skipped. The last frame
    lasts its own duration.
    """
    container, stream = _open_video(path)
    problems = {"undecodable": 0, "untimed": 0}
    with container:
        info = _video_info(path, container, stream)
        stream.thread_type = "AUTO"  # frame and slice threads, as OpenCV decodes
        time_base, origin, period = float(stream.time_base), stream.start_time, 1.0 / info.fps
        placer = _FramePlacer(1.0 / target_fps)
        pending: list[tuple[float, int, Any]] = []  # heap of (time, decode order, frame)
        try:
            next_time = 0.0  # where a frame without a timestamp goes: the frame before it plus its duration
            for order, frame in enumerate(_decoded_frames(container, stream, problems)):
                if frame.pts is None:
                    problems["untimed"] += 1
                    time_s = next_time
                else:
                    origin = frame.pts if origin is None else origin
                    time_s = (frame.pts - origin) * time_base
                next_time = time_s + (frame.duration * time_base if frame.duration > 0 else period)
                heapq.heappush(pending, (time_s, order, frame))
                if len(pending) > REORDER_FRAMES:
                    time_s, _, earliest = heapq.heappop(pending)
                    yield from placer.place(time_s, earliest)
            while pending:
                time_s, _, earliest = heapq.heappop(pending)
                yield from placer.place(time_s, earliest)
            if placer.frame is not None:  # the last frame lasts its own duration (one average period if unknown)
                duration = placer.frame.duration * time_base
                yield from placer.hold(placer.time + (duration if duration > 0 else period))
        finally:
            if notes is not None:
                notes.extend(_decode_notes(problems, placer.gaps, placer.out_of_order, period))


def _decode_notes(problems: dict[str, int], gaps: list[tuple[float, float]], out_of_order: int,
                  period: float) -> list[str]:
    """Warnings about an irregular video stream, worded `<what>: <numbers>; <what was done>`."""
    notes = []
    if gaps:
        start, end = max(gaps, key=lambda gap: gap[1] - gap[0])
        notes.append(f"video timestamp gaps: {len(gaps)} longer than {GAP_SECONDS:g} s (longest {end - start:.2f} s, "
                     f"{start:.2f}-{end:.2f} s); the frame before each gap is held across it")
    if problems["untimed"]:
        notes.append(f"video frames without a timestamp: {problems['untimed']}; each is placed one frame duration "
                     f"(the codec's, else 1 / the average rate of {1 / period:g} fps) after the frame before it")
    if out_of_order:
        notes.append(f"video frames out of timestamp order: {out_of_order} with a time at or before a "
                     f"frame already placed (after reordering up to {REORDER_FRAMES} frames); they are left out")
    if problems["undecodable"]:
        notes.append(f"undecodable video packets: {problems['undecodable']}; skipped, the frame before each is held")
    return notes


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
