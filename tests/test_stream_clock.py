"""Video and audio of one container are placed on one session clock whose 0 is the recording's start
(media.session_origin): an audio stream that starts 2.5 s after its video (as `ffmpeg -itsoffset 2.5` or a
recorder writes it) gives the features of the same audio recorded from 0, its leading frames masked and
reported; a video that starts late leaves its leading frames without a picture; a codec's priming offset
shifts nothing and is not reported. Media are made with PyAV from the real recordings in
../shared/data/media, into tmp_path."""
from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from empathic_fusion.utils import PROJECT_ROOT
from tests.test_audio_channels import mono_speech

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
from bad_inputs import mux_mono_audio  # noqa: E402  (the benchmark's writer of a late audio track)

MEDIA = PROJECT_ROOT.parent / "shared" / "data" / "media"
PEXELS, SINGLE, ARCTIC = MEDIA / "WolfgangLanger_Pexels.mp4", MEDIA / "single_face.mp4", MEDIA / "arctic_a0007.wav"
pytestmark = pytest.mark.skipif(not all(p.exists() for p in (PEXELS, SINGLE, ARCTIC)),
                                reason="../shared/data/media is not beside the checkout")
FPS = 15.0
RATE = 48000
LATE_S = 2.5


def pexels_with_audio(path: Path, audio: np.ndarray, audio_start_s: float) -> None:
    """The Pexels clip's H.264 video (its packets, unchanged) with `audio` as an AAC mono track whose first
    sample is at audio_start_s on the container's clock: the mp4 muxer writes the delay as an edit list."""
    import av

    with av.open(str(PEXELS)) as source, av.open(str(path), "w") as container:
        video_in = source.streams.video[0]
        video = container.add_stream_from_template(video_in)
        sound = container.add_stream("aac", rate=RATE, layout="mono")
        for packet in source.demux(video_in):
            if packet.dts is not None:
                packet.stream = video
                container.mux(packet)
        mux_mono_audio(container, sound, audio, RATE, audio_start_s)


def audio_start(path: Path) -> float:
    """The audio stream's start on the container's clock, as FFmpeg's demuxer reads it (edit list applied)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        return float(stream.start_time * stream.time_base)


def test_audio_starting_late_in_its_container_lines_up_with_audio_recorded_from_0(tmp_path):
    from empathic_fusion.features.audio_smile import extract_audio
    from empathic_fusion.features.media import probe_video

    unit = np.concatenate([mono_speech(RATE), np.zeros(RATE, dtype=np.float32)])  # the sentence, a second's pause
    speech = np.tile(unit, 4)[: int((19.6 - LATE_S) * RATE)]
    clean, late = tmp_path / "clean.mp4", tmp_path / "late.mp4"
    pexels_with_audio(clean, np.concatenate([np.zeros(int(LATE_S * RATE), dtype=np.float32), speech]), 0.0)
    pexels_with_audio(late, speech, LATE_S)
    start = audio_start(late)
    assert 2.4 < start < 2.5  # the edit list's delay, less AAC's priming (1024 samples), in the movie's time scale

    ours, info, warnings = extract_audio(late, FPS)
    theirs, clean_info, clean_warnings = extract_audio(clean, FPS)
    leading = math.floor(start * FPS)  # the first frame with an LLD frame starting in it
    assert warnings == [f"late.mp4: audio starts {start:.2f} s after the recording's start: frames 0-{leading - 1} "
                        f"have no audio and are masked"]
    assert clean_warnings == []
    assert not ours["mask"][:leading].any() and ours["mask"][leading:].all()
    assert not ours["features"][:leading].any() and not ours["voiced"][:leading].any()
    assert abs(info["n_frames"] - clean_info["n_frames"]) <= 1  # both end with the video, on the session clock
    assert info["start_seconds"] == pytest.approx(start, abs=1 / 16000) and clean_info["start_seconds"] == 0
    # the loudness lines up at lag 0 (before the session clock it was 37 frames early), over the frames both have
    loudness = info["feature_names"].index("pcm_RMSenergy_sma")
    n = min(info["n_frames"], clean_info["n_frames"])
    a, b = ours["features"][:n, loudness].astype(np.float64), theirs["features"][:n, loudness].astype(np.float64)
    frames = np.arange(leading + int(FPS), n - 45)  # a second in: openSMILE's start-up in the late one

    def r(lag: int) -> float:
        return float(np.corrcoef(a[frames], b[frames - lag])[0, 1])

    agreement = {lag: r(lag) for lag in range(-45, 46)}
    assert max(agreement, key=agreement.get) == 0
    assert agreement[0] > 0.98, agreement[0]  # measured 0.999 (the two AAC encodings differ a little)
    # the video starts first: its frames are where they always were
    assert probe_video(late).start == 0 and probe_video(late).frames_at(FPS) == probe_video(PEXELS).frames_at(FPS)


def face_video(path: Path, video_start_s: float, audio: np.ndarray | None) -> int:
    """single_face.mp4's 72 frames (320x180, 30 fps; H.264) starting at video_start_s, with `audio` (48 kHz
    AAC) from 0; the number of frames."""
    import av
    import cv2

    with av.open(str(SINGLE)) as source:
        images = [cv2.resize(f.to_ndarray(format="bgr24"), (320, 180), interpolation=cv2.INTER_AREA)
                  for f in source.decode(video=0)]
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=30)
        video.width, video.height, video.pix_fmt = 320, 180, "yuv420p"
        video.options = {"qp": "10", "preset": "ultrafast"}
        sound = container.add_stream("aac", rate=RATE, layout="mono") if audio is not None else None
        first = int(round(video_start_s * 30))
        for k, image in enumerate(images):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts, frame.time_base = first + k, Fraction(1, 30)
            container.mux(video.encode(frame))
        container.mux(video.encode())
        if sound is not None:
            for start in range(0, len(audio), 1024):
                frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio[None, start:start + 1024]), format="flt",
                                                   layout="mono")
                frame.sample_rate, frame.pts, frame.time_base = RATE, start, Fraction(1, RATE)
                container.mux(sound.encode(frame))
            container.mux(sound.encode(None))
    return len(images)


def test_video_starting_after_its_audio_has_no_picture_before_its_first_frame(tmp_path):
    """A camera that starts 4 s after the microphone: frames 0-59 (at 15 fps) show nothing and are masked,
    reported once as the late start, never as a stretch without a face or as a truncated video."""
    from empathic_fusion.features.audio_smile import extract_audio
    from empathic_fusion.features.media import iter_frames, probe_video
    from empathic_fusion.features.video_pass import extract_video

    video = tmp_path / "camera_late.mp4"
    count = face_video(video, 4.0, np.tile(mono_speech(RATE), 2))  # 8 s of audio from 0
    info = probe_video(video)
    late = 60  # 4 s at 15 fps
    assert info.start == pytest.approx(4.0) and info.frames_at(FPS) == late + count // 2
    notes: list[str] = []
    placed = list(iter_frames(video, FPS, notes))
    assert [t for t, _, _ in placed] == list(range(late, late + count // 2))
    assert [s for _, s, _ in placed] == list(range(0, count, 2))  # 30 fps decimated from the first frame on
    assert notes == ["video starts 4.00 s after the recording's start: frames 0-59 have no picture and are masked"]
    arrays, face_info, face_notes = extract_video(video, FPS, face_cfg={})["face"]
    assert face_info["n_frames"] == late + count // 2 and face_info["decoded_frames"] == count // 2
    assert not arrays["mask"][:late].any() and arrays["mask"][late:].mean() > 0.9
    assert face_notes[0] == notes[0]
    assert not [n for n in face_notes if "truncated" in n or "no participant face" in n], face_notes
    # the audio starts the session: placed from 0, nothing reported
    audio, audio_info, audio_warnings = extract_audio(video, FPS)
    assert audio_warnings == [] and audio["mask"][:late].all() and audio_info["start_seconds"] == 0


def test_a_priming_offset_shifts_nothing_and_is_not_reported(tmp_path):
    """Audio written from 21 ms before the video (a codec's 1024 priming samples at 48 kHz); Matroska's
    muxer moves both streams up until none is negative, so the audio starts at 0 and the video at 21 ms.
    That is less than a frame: the video's start stays the session's 0, the audio's first 21 ms are dropped,
    and nothing is reported. PCM keeps every sample where it is written."""
    import av

    from empathic_fusion.features.audio_smile import extract_audio
    from empathic_fusion.features.media import decode_audio, iter_frames, probe_video

    priming = 1024
    audio = np.zeros(priming + 3 * RATE, dtype=np.float32)
    audio[priming + RATE: priming + RATE + 480] = 0.5  # a 10 ms click at 1.0 s on the video's clock
    path = tmp_path / "primed.mkv"
    with av.open(str(path), "w") as container:
        video = container.add_stream("libx264", rate=10)
        video.width, video.height, video.pix_fmt = 64, 64, "yuv420p"
        video.options = {"qp": "0", "preset": "ultrafast"}
        sound = container.add_stream("pcm_s16le", rate=RATE, layout="mono")
        for k in range(30):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 8 * k, dtype=np.uint8), format="bgr24")
            frame.pts, frame.time_base = k, Fraction(1, 10)
            container.mux(video.encode(frame))
        container.mux(video.encode())
        frame = av.AudioFrame.from_ndarray(audio[None], format="flt", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, -priming, Fraction(1, RATE)
        container.mux(sound.encode(frame))
        container.mux(sound.encode(None))
    assert audio_start(path) == 0 and probe_video(path).start == pytest.approx(0.021)  # Matroska's milliseconds
    track = decode_audio(path, fps=FPS)
    assert track.start == 0.0
    assert abs(int(np.argmax(track.samples > 0.25)) - 16000) <= 16  # the click at 1.0 s, within 1 ms
    assert len(track.samples) == pytest.approx(3 * 16000, abs=16)
    assert probe_video(path).frames_at(FPS) == 45
    notes: list[str] = []
    assert [t for t, _, _ in iter_frames(path, FPS, notes)] == list(range(45)) and notes == []
    arrays, info, warnings = extract_audio(path, FPS)
    assert warnings == [] and info["n_frames"] == 45 and arrays["mask"].all()


def test_a_separate_audio_file_of_another_length_gets_the_fix_named(tmp_path):
    """A separate audio file shares no clock with the video: the length warning says the difference may be
    at the start and how to trim or pad the file; audio from the video's own container gets the plain note."""
    from empathic_fusion.features.extract import _length_warning
    from empathic_fusion.features.store import FeatureStore

    store = FeatureStore(tmp_path / "store")

    def record(sid: str, branch: str, frames: int, inputs: dict) -> None:
        store.write_branch(sid, branch, {"mask": np.ones(frames, dtype=np.uint8)},
                           {"extractor": "test", "config": {"fps": FPS}, "inputs": inputs}, {"n_frames": frames})

    record("late_mic", "face", 295, {"video": "aaa"})
    record("late_mic", "audio", 60, {"audio": "bbb"})  # 15.67 s shorter
    assert _length_warning(store, "late_mic") == (
        "session 'late_mic': video has 295 frames (19.7 s) but audio 60 (4.0 s); both start at 0 and the shorter one "
        "is masked after its end. The audio is a separate file: if its recorder started up to 15.67 s after the "
        "camera, the gap is at the start and the audio runs early; pad its start by the offset (e.g. `sox audio.wav "
        "fixed.wav pad 15.67` or `ffmpeg -i audio.wav -af adelay=15667:all=1 fixed.wav`) and point sessions.csv's "
        "audio at the result")
    record("early_mic", "face", 60, {"video": "ccc"})
    record("early_mic", "audio", 90, {"audio": "ddd"})
    assert _length_warning(store, "early_mic").endswith(
        "if its recorder started up to 2.00 s before the camera, the gap is at the start and the audio runs late; "
        "trim the offset from its start (e.g. `sox audio.wav fixed.wav trim 2.00` or `ffmpeg -ss 2.00 -i audio.wav "
        "fixed.wav`) and point sessions.csv's audio at the result")
    record("one_file", "face", 295, {"video": "eee"})
    record("one_file", "audio", 260, {"audio": "eee"})  # the container's own audio stream, ending first
    assert _length_warning(store, "one_file") == (
        "session 'one_file': video has 295 frames (19.7 s) but audio 260 (17.3 s); both start at 0 and the shorter "
        "one is masked after its end")
