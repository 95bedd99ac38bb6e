"""Reading media: video frames resampled onto the dataset's frame clock, audio as 16 kHz mono."""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from empathic_fusion.core.errors import UserError
from empathic_fusion.features.hdr import sdr_bgr, transfer as hdr_transfer


class MediaError(UserError, RuntimeError):
    """A media file that cannot be read; the message names the file and what failed."""


@dataclass(frozen=True)
class VideoInfo:
    fps: float  # average frame rate (frames / duration); variable-rate video has no other single rate
    declared_frames: int  # from the container header; 0 when unknown
    width: int
    height: int
    duration: float = 0.0  # seconds: the longer of the stream's and frames / fps (else the container's); 0: unknown
    # seconds from the recording's start to the video's first frame: how much earlier the container's audio
    # starts (0 when the video starts first or there is no audio); see session_origin
    start: float = 0.0

    def lead(self, target_fps: float) -> float:
        """Seconds of the session clock before the video's first frame: `start`, when it is at least one frame
        of the target clock (a smaller difference is a codec's offset, not a recording's: session_origin)."""
        return self.start if self.start * target_fps >= 1.0 - 1e-9 else 0.0

    def frames_at(self, target_fps: float) -> int:
        """Number of frames on the dataset clock covering the declared duration, from the session's 0 (the
        frames before a late video's first frame included)."""
        seconds = self.duration
        if seconds <= 0 and self.declared_frames > 0 and self.fps > 0:
            seconds = self.declared_frames / self.fps
        return int(math.floor((self.lead(target_fps) + seconds) * target_fps + 1e-6)) if seconds > 0 else 0


# Frames held back to put frames a decoder gives out of timestamp order back in order (a stream without
# reorder information: FFmpeg's "Increasing reorder buffer"). Decoders give presentation order otherwise.
REORDER_FRAMES = 8
# A frame shown longer than this (a gap in the timestamps: a recorder that stalled or dropped frames) is
# held across the gap, as a player shows it, and the gap is reported.
GAP_SECONDS = 1.0


def _video_streams(container) -> list:
    """The container's video streams that are not a cover picture or thumbnails."""
    from av.stream import Disposition

    stills = Disposition.attached_pic | Disposition.timed_thumbnails
    return [s for s in container.streams.video if not s.disposition & stills]


def unreadable(path: Path, error: Exception) -> str:
    """Why FFmpeg cannot open a media file, in words: empty, cut short, or FFmpeg's own message."""
    import av

    try:
        size = path.stat().st_size
    except OSError:
        size = None
    if size == 0:
        return "the file is empty (0 bytes): the recording or its copy did not finish; copy it again from its source"
    if isinstance(error, av.error.InvalidDataError):
        mp4 = path.suffix.lower() in (".mp4", ".m4v", ".m4a", ".mov", ".3gp")
        return ("the file is cut short or damaged: FFmpeg finds no readable header in its "
                f"{size} bytes (\"{error.strerror or error}\")"
                + ("; an MP4 or MOV whose recording or copy stopped early has no index (its 'moov' atom), which "
                   "FFmpeg needs: copy it again, or repair it with a tool that rebuilds the index from a good file "
                   "of the same camera (e.g. untrunc)" if mp4 else "; copy it again from its source"))
    return str(error)


def open_container(path: Path, what: str):
    """The file opened with PyAV; MediaError `cannot open <what> <path>: <why>` (`unreadable`) when FFmpeg cannot."""
    import av

    try:
        return av.open(str(path))
    except Exception as error:  # noqa: BLE001 - PyAV raises several error types for unreadable files
        raise MediaError(f"cannot open {what} {path}: {unreadable(path, error)}") from error


def _open_video(path: Path):
    """(PyAV container, its video stream: the first that is not a cover picture or thumbnails); MediaError
    naming the file when it has none."""
    container = open_container(path, "video")
    streams = _video_streams(container)
    if not streams:
        container.close()
        raise MediaError(f"cannot open video {path}: it has no video stream")
    return container, streams[0]


# ---- the session clock ---------------------------------------------------------------------------
# A recording's streams need not start together: a recorder that starts its audio late, or `ffmpeg
# -itsoffset`, writes an audio stream that starts seconds after the video (an mp4 says so in an edit list,
# which FFmpeg's mov demuxer turns into the stream's start time). Video frames and audio samples are placed
# on one session clock whose 0 is the recording's start, as a player shows time 0: the earlier stream's
# start. Streams less than one frame of the dataset clock apart (a codec's priming offset, such as AAC's
# 1024 samples, -21 ms at 48 kHz) are taken to start together, at the video's start; audio samples before
# the session's 0 are dropped. A stream without a start time is taken to start at the session's 0.


def _start_seconds(stream) -> float | None:
    """A stream's start time in seconds on the container's clock (edit lists applied); None when unknown."""
    if stream is None or stream.start_time is None or not stream.time_base:
        return None
    return float(stream.start_time * stream.time_base)


def session_origin(video_start: float | None, audio_start: float | None, fps: float | None) -> float:
    """The session's 0 on the container's clock: the video's start, unless the audio starts at least one
    frame (1 / fps; any difference when fps is None) earlier; either start may be unknown (None)."""
    known = [start for start in (video_start, audio_start) if start is not None]
    if not known:
        return 0.0
    if video_start is None or audio_start is None:
        return known[0]
    apart = abs(audio_start - video_start) * fps >= 1.0 - 1e-9 if fps else audio_start != video_start
    return min(video_start, audio_start) if apart else video_start


def _container_starts(container) -> tuple[float | None, float | None]:
    """(video start, first audio stream's start) in seconds on the container's clock; None: none or unknown."""
    video = _video_streams(container)
    audio = container.streams.audio
    return (_start_seconds(video[0]) if video else None), (_start_seconds(audio[0]) if audio else None)


def late_start_note(what: str, late_s: float, masked_frames: int, missing: str) -> str:
    """`<what> starts <s> after the recording's start: frames 0-<k> have no <missing> and are masked`."""
    frames = "frame 0 has" if masked_frames == 1 else f"frames 0-{masked_frames - 1} have"
    verb = "is" if masked_frames == 1 else "are"
    return f"{what} starts {late_s:.2f} s after the recording's start: {frames} no {missing} and {verb} masked"


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
    video_start, audio_start = _container_starts(container)
    start = max(video_start - audio_start, 0.0) if video_start is not None and audio_start is not None else 0.0
    return VideoInfo(fps=fps, declared_frames=frames, width=int(context.width), height=int(context.height),
                     duration=duration, start=start)


def probe_video(path: Path) -> VideoInfo:
    """Frame rate, declared frames, coded size, duration and start (against the audio's) from the
    container's header."""
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
    portrait video), as OpenCV shows it; an HDR frame (PQ, HLG) as an SDR recording would show it (hdr.py)."""
    image = sdr_bgr(frame) if hdr_transfer(frame) else frame.to_ndarray(format="bgr24")
    turns = int(round((frame.rotation or 0) / 90)) % 4  # counter-clockwise, as np.rot90
    return np.ascontiguousarray(np.rot90(image, turns)) if turns else image


class _FramePlacer:
    """Puts source frames, given in time order, onto the target clock: target i shows the last frame whose
    time is at or before i * step. A frame is converted to an image once, and only if a target shows it.
    Targets before the first frame (a video that starts at least one target frame after the session's 0)
    show nothing: they are not yielded."""

    def __init__(self, step: float):
        self.step = step
        self.next_target, self.source, self.time = 0, -1, -math.inf
        self.frame, self.image = None, None
        self.gaps: list[tuple[float, float]] = []  # (from, to) seconds of frames shown longer than GAP_SECONDS
        self.out_of_order = 0
        self.first_target, self.first_time = 0, 0.0  # of the first frame placed, when after target 0
        self.resolutions: list[tuple[float, tuple[int, int], tuple[int, int]]] = []  # (time, from, to) of each change
        self.hdr: tuple[str, int] | None = None  # (transfer, bits) of the first HDR frame placed

    def place(self, time_s: float, frame) -> Iterator[tuple[int, int, np.ndarray]]:
        """Yield the targets the previous frame covers before time_s; then this frame is the previous one."""
        if time_s <= self.time:
            self.out_of_order += 1
            return
        if self.frame is not None and (frame.width, frame.height) != (self.frame.width, self.frame.height):
            self.resolutions.append((time_s, (self.frame.width, self.frame.height), (frame.width, frame.height)))
        if self.hdr is None and (kind := hdr_transfer(frame)):
            self.hdr = (kind, frame.format.components[0].bits)
        if self.frame is not None:
            if time_s - self.time > GAP_SECONDS:
                self.gaps.append((self.time, time_s))
            yield from self.hold(time_s)
        elif time_s >= self.step - 1e-9:  # the first target at or after the first frame; less than a frame: 0
            self.next_target = self.first_target = math.ceil((time_s - 1e-9) / self.step)
            self.first_time = time_s
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
    presentation timestamp (PyAV; exact, in the stream's time base) on the session clock (session_origin:
    from the video stream's start, or from the audio's when that starts at least one target frame earlier);
    source_index counts the source frames in presentation order. Targets before the first frame are not
    yielded (the caller masks them), and reported in `notes`.

    Irregular streams are handled and, when `notes` is given, reported there: frames a decoder gives
    out of order are put back in order (up to REORDER_FRAMES apart); a frame whose time is at or before
    one already placed is left out; a frame without a timestamp is placed one frame duration after the
    frame before it (the codec's duration, else 1 / average rate: the only clock it has); a frame shown
    longer than GAP_SECONDS is held across the gap; an undecodable packet is skipped; a change of the
    picture's size is reported with its time. The last frame lasts its own duration.
    """
    container, stream = _open_video(path)
    problems = {"undecodable": 0, "untimed": 0}
    with container:
        info = _video_info(path, container, stream)
        stream.thread_type = "AUTO"  # frame and slice threads, as OpenCV decodes
        time_base, origin, period = float(stream.time_base), stream.start_time, 1.0 / info.fps
        lead = info.lead(target_fps)  # seconds from the session's 0 to the video stream's start
        placer = _FramePlacer(1.0 / target_fps)
        pending: list[tuple[float, int, Any]] = []  # heap of (time, decode order, frame)
        try:
            next_time = lead  # where a frame without a timestamp goes: the frame before it plus its duration
            for order, frame in enumerate(_decoded_frames(container, stream, problems)):
                if frame.pts is None:
                    problems["untimed"] += 1
                    time_s = next_time
                else:
                    origin = frame.pts if origin is None else origin
                    time_s = (frame.pts - origin) * time_base + lead
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
                if placer.first_target:
                    notes.append(late_start_note("video", placer.first_time, placer.first_target, "picture"))
                notes.extend(_decode_notes(problems, placer.gaps, placer.out_of_order, period))
                if placer.resolutions:
                    notes.append(_resolution_note(placer.resolutions))
                if placer.hdr:
                    notes.append(f"HDR video ({placer.hdr[0]}, {placer.hdr[1]}-bit): its frames are mapped to SDR "
                                 "(BT.709, HDR reference white of 203 nits as SDR white, highlights rolled off) before "
                                 "the face mesh and the frame CNN read them")


RESOLUTIONS_LISTED = 3  # the first resolution changes a note names; the rest are counted


def _resolution_note(changes: list[tuple[float, tuple[int, int], tuple[int, int]]]) -> str:
    """`video resolution changes: 640x360 -> 320x180 at 10.00 s; ...`: a stream whose picture size changes (two
    recordings joined, a phone's stream adapting its quality)."""
    listed = ", ".join(f"{a[0]}x{a[1]} -> {b[0]}x{b[1]} at {time_s:.2f} s" for time_s, a, b in changes[:RESOLUTIONS_LISTED])
    more = f" and {len(changes) - RESOLUTIONS_LISTED} more" if len(changes) > RESOLUTIONS_LISTED else ""
    return (f"video resolution changes: {listed}{more}; faces are followed in proportion to the frame, and the "
            "frames are used at the size they have")


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
BLOCK_SECONDS = 1.0  # AudioStream.blocks() gives about this much audio at a time


@dataclass(frozen=True)
class AudioTrack:
    """Decoded audio downmixed to mono, with what the downmix saw: the channels, which of them were
    averaged, and the samples at or near full scale in each (counted at the input's own rate)."""

    samples: np.ndarray            # float32 mono at the requested rate
    layout: str                    # FFmpeg's name of the input's channel layout, e.g. "5.1", "stereo", "1 channels"
    channels: tuple[str, ...]      # the input's channels, in stream order (FFmpeg names, or 1, 2, ... when unnamed)
    mixed: tuple[str, ...]         # the channels averaged into `samples`: those that carry signal
    clipped: tuple[int, ...]       # per input channel: samples with |x| >= FULL_SCALE
    clipped_span: tuple[float, float] | None  # session seconds of the first and last such sample
    start: float = 0.0             # session seconds of samples[0] (session_origin); > 0: the audio starts late
    source_rate: int = 0           # the input's sample rate in Hz


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


class AudioStream:
    """A wav file's or a video container's first audio stream as mono float32 blocks at sample_rate, on the
    session clock: memory does not grow with the recording's length.

    Mono input is only converted and resampled (FFmpeg via PyAV), in one pass. Input with several channels
    is resampled channel by channel and averaged, never summed (FFmpeg's own downmix adds 5.1's channels up
    to 3.4x the level of one), over the channels that carry signal: those whose RMS is at least
    SIGNAL_CHANNEL_RMS of the loudest channel's. Speech in all channels, in the centre channel of 5.1 only,
    or on one channel of a one-microphone stereo recording thus keeps the level it was recorded at. Which
    channels carry signal takes the whole file, so such input is read twice: a first pass measures each
    channel's RMS (at sample_rate, as the mix sees it) and its clipping, the second mixes block by block.

    `fps` (the dataset's frame rate) puts the audio on the session clock (session_origin): samples before
    the session's 0 (a codec's priming) are dropped, and `start` says where the first sample lies (an audio
    stream that starts after the video). Without fps, streams any amount apart count as apart (session_origin).
    The layout, channels, mixed and clipping are known once blocks() has been read to its end (several
    channels: once the stream is made); start once the first block has been read.
    """

    def __init__(self, path: Path, sample_rate: int = 16000, fps: float | None = None):
        self.path, self.sample_rate = Path(path), sample_rate
        with open_container(self.path, "audio in") as container:
            if not container.streams.audio:
                raise MediaError(f"{path} has no audio stream")
            context = container.streams.audio[0].codec_context
            self.source_rate = int(context.sample_rate or 0)
            self.layout, self.channels = context.layout.name, _channel_names(context.layout)
            video_start, self._stream_start = _container_starts(container)
        self._origin = session_origin(video_start, self._stream_start, fps)
        self.mixed = self.channels
        self.clipped: tuple[int, ...] = (0,) * len(self.channels)
        self._clip_times: tuple[float, float] | None = None  # seconds from the first decoded sample
        self._lead = 0.0  # seconds from the session's 0 to the first decoded sample (< 0: dropped)
        self.start_samples = 0  # samples (at sample_rate) from the session's 0 to the first sample given
        self.samples = 0  # samples given so far
        self._carrying: np.ndarray | None = None  # several channels: those averaged
        if len(self.channels) != 1:  # several, or not known before decoding
            self._measure_channels()

    @property
    def start(self) -> float:
        """Session seconds of the first sample blocks() gives."""
        return self.start_samples / self.sample_rate

    @property
    def clipped_span(self) -> tuple[float, float] | None:
        """Session seconds of the first and last sample at or near full scale."""
        if self._clip_times is None:
            return None
        first, last = self._clip_times
        return max(first + self._lead, 0.0), max(last + self._lead, 0.0)

    def _decoded(self, count_clipping: bool) -> Iterator[np.ndarray]:
        """(channels, samples) float32 at sample_rate, frame by frame: one channel by FFmpeg's mono
        conversion, several kept apart (planar). Records the layout, the first sample's time and, when
        count_clipping, the samples at or near full scale."""
        import av

        with open_container(self.path, "audio in") as container:
            resampler, produced = None, False
            clipped = np.zeros(0, dtype=np.int64)
            decoded = 0  # samples per channel at the input's rate so far
            if count_clipping:
                self._clip_times = None
            try:
                for frame in container.decode(container.streams.audio[0]):
                    if resampler is None:
                        self.layout, self.channels = frame.layout.name, _channel_names(frame.layout)
                        self.source_rate = int(frame.sample_rate)
                        clipped = np.zeros(len(self.channels), dtype=np.int64)
                        first = (float(frame.pts * frame.time_base) if frame.pts is not None and frame.time_base
                                 else self._stream_start)
                        self._lead = first - self._origin if first is not None else 0.0
                        # one channel: FFmpeg's mono conversion, as always (no mixing); several: kept apart, planar
                        resampler = (av.AudioResampler(format="flt", layout="mono", rate=self.sample_rate)
                                     if len(self.channels) == 1
                                     else av.AudioResampler(format="fltp", layout=frame.layout, rate=self.sample_rate))
                    if count_clipping:
                        at_full_scale = _full_scale_samples(frame)
                        if at_full_scale.any():
                            clipped[: len(at_full_scale)] += at_full_scale.sum(axis=1)
                            where = np.flatnonzero(at_full_scale.any(axis=0))
                            first_clip = (decoded + where[0]) / frame.sample_rate
                            last_clip = (decoded + where[-1]) / frame.sample_rate
                            self._clip_times = ((first_clip, last_clip) if self._clip_times is None
                                                else (self._clip_times[0], last_clip))
                    decoded += frame.samples
                    for out in resampler.resample(frame):
                        produced = True
                        yield out.to_ndarray().reshape(len(self.channels), -1)
                if resampler is not None:
                    for out in resampler.resample(None):
                        produced = True
                        yield out.to_ndarray().reshape(len(self.channels), -1)
            except av.error.FFmpegError as error:  # a truncated file: what was decoded is kept
                if not produced:
                    raise MediaError(f"cannot decode audio in {self.path}: {error}") from error
            finally:
                if count_clipping and len(clipped):
                    self.clipped = tuple(int(n) for n in clipped)
        if not produced:
            raise MediaError(f"{self.path} contains no audio samples")

    def _measure_channels(self) -> None:
        """First pass over several channels: each one's RMS, the channels that carry signal, the clipping."""
        squares, count = None, 0
        for planar in self._decoded(count_clipping=True):
            block = np.square(planar, dtype=np.float64).sum(axis=1)
            squares, count = (block if squares is None else squares + block), count + planar.shape[1]
        rms = np.sqrt(squares / max(count, 1))
        self._carrying = rms >= SIGNAL_CHANNEL_RMS * rms.max() if rms.max() > 0 else np.ones(len(rms), dtype=bool)
        self.mixed = tuple(name for name, keep in zip(self.channels, self._carrying) if keep)

    def blocks(self) -> Iterator[np.ndarray]:
        """Mono float32 blocks of about BLOCK_SECONDS at sample_rate, from the first sample at or after the
        session's 0 (its time: start), in order."""
        block = int(BLOCK_SECONDS * self.sample_rate)
        pending: list[np.ndarray] = []
        held, drop, first = 0, 0, True
        self.samples = 0
        for planar in self._decoded(count_clipping=self._carrying is None):
            if first:  # the first sample's time is known once the first frame is decoded
                first = False
                offset = int(round(self._lead * self.sample_rate))
                drop, self.start_samples = max(-offset, 0), max(offset, 0)
            if planar.shape[0] == 1:
                mono = planar[0]
            else:
                mono = planar[self._carrying].mean(axis=0, dtype=np.float64).astype(np.float32)
            if drop:
                mono, drop = mono[drop:], max(drop - len(mono), 0)
            if len(mono):
                pending.append(mono)
                held += len(mono)
            if held >= block:
                yield np.concatenate(pending)
                self.samples += held
                pending, held = [], 0
        if pending:
            yield np.concatenate(pending)
            self.samples += held


def decode_audio(path: Path, sample_rate: int = 16000, fps: float | None = None) -> AudioTrack:
    """A wav file's or a video container's first audio stream as mono float32 at sample_rate, whole
    (AudioStream describes the downmix and, with fps, the session clock). A long recording is better read
    with AudioStream.blocks(), which holds one block at a time."""
    stream = AudioStream(path, sample_rate, fps)
    blocks = list(stream.blocks())
    samples = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.float32)
    return AudioTrack(samples=samples, layout=stream.layout, channels=stream.channels, mixed=stream.mixed,
                      clipped=stream.clipped, clipped_span=stream.clipped_span, start=stream.start,
                      source_rate=stream.source_rate)


def load_audio(path: Path, sample_rate: int = 16000) -> np.ndarray:
    """Mono float32 samples at sample_rate from a wav file or a video container's first audio stream
    (channels averaged as AudioStream describes)."""
    return decode_audio(path, sample_rate).samples
