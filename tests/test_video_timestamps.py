"""Video frames are placed by their container timestamps: a variable-rate video gives the features its
constant-rate original gives at the same times; B-frames, timestamp gaps and frames without timestamps
are placed as documented (media.iter_frames) and reported. Videos are written into tmp_path with PyAV."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from empathic_fusion.features.media import iter_frames, probe_video
from empathic_fusion.utils import PROJECT_ROOT

MEDIA = PROJECT_ROOT.parent / "shared" / "data" / "media"
real_face = pytest.mark.skipif(not (MEDIA / "single_face.mp4").exists(),
                               reason="../shared/data/media is not beside the checkout")


def write_video(path: Path, frames: list[tuple[int, np.ndarray]], rate: int = 30, options: dict | None = None,
                container_format: str | None = None) -> None:
    """H.264 from (pts in 1/rate s, BGR image) pairs; lossless by default (qp 0), so two videos of the
    same images decode to the same pixels whatever their timing."""
    import av

    height, width = frames[0][1].shape[:2]
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = options or {"qp": "0", "preset": "ultrafast"}
        for pts, image in frames:
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts, frame.time_base = pts, Fraction(1, rate)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


def face_frames(size: tuple[int, int] = (320, 180)) -> list[np.ndarray]:
    """single_face.mp4's 72 frames, downscaled."""
    import av
    import cv2

    with av.open(str(MEDIA / "single_face.mp4")) as container:
        return [cv2.resize(f.to_ndarray(format="bgr24"), size, interpolation=cv2.INTER_AREA)
                for f in container.decode(video=0)]


def ping_pong(frames: list[np.ndarray], index: int) -> np.ndarray:
    """The clip played forwards and backwards, as long as needed."""
    period = 2 * len(frames) - 2
    index %= period
    return frames[index if index < len(frames) else period - index]


@real_face
def test_variable_rate_video_gives_the_features_of_its_constant_rate_original(tmp_path):
    """8 s at 5 fps, then 8 s at 30 fps (a phone's variable rate; average 17.5 fps), against the same
    pictures at a constant 30 fps. On a 5 fps clock both show the same picture at every time."""
    from empathic_fusion.features.video_pass import extract_video

    faces = face_frames()
    picture = lambda tick: ping_pong(faces, tick // 6 if tick < 240 else 40 + tick - 240)  # noqa: E731
    constant, variable = tmp_path / "constant.mp4", tmp_path / "variable.mp4"
    write_video(constant, [(tick, picture(tick)) for tick in range(480)])
    write_video(variable, [(tick, picture(tick)) for tick in range(480) if tick >= 240 or tick % 6 == 0])
    placed, expected = list(iter_frames(variable, 5.0)), list(iter_frames(constant, 5.0))
    assert [t for t, _, _ in placed][:80] == [t for t, _, _ in expected] == list(range(80))
    wrong = [t for (t, _, image), (_, _, original) in zip(placed, expected) if not np.array_equal(image, original)]
    assert wrong == []  # the same picture at the same time, every frame
    assert [s for _, s, _ in placed[:42]] == list(range(40)) + [40, 40 + 6]  # 5 fps, then every 6th of 30 fps
    ours, theirs = extract_video(variable, 5.0, face_cfg={})["face"], extract_video(constant, 5.0, face_cfg={})["face"]
    assert ours[0]["mask"].all() and ours[2] == theirs[2] == []
    assert np.array_equal(ours[0]["features"], theirs[0]["features"])
    assert np.array_equal(ours[0]["mask"], theirs[0]["mask"])
    info = probe_video(variable)  # the duration is the stream's, not frames / a rate
    assert info.declared_frames == 280 and info.duration == pytest.approx(16.0) and info.fps == pytest.approx(17.5)
    assert info.frames_at(5.0) == probe_video(constant).frames_at(5.0) == 80
    notes: list[str] = []
    assert len(list(iter_frames(variable, 5.0, notes))) == 80 and notes == []


def marked(index: int, noise: np.ndarray) -> np.ndarray:
    """A 64 x 64 picture whose top band's grey level says its index (10 per index); the moving noise
    below makes the encoder use B-frames."""
    image = np.roll(noise, 3 * index, axis=1).copy()
    image[:16] = 10 * index
    return image


def marks(frames) -> list[int]:
    return [int(round(float(image[2:14].mean()) / 10)) for _, _, image in frames]


def test_b_frames_timestamp_gaps_and_untimed_frames_are_placed_and_reported(tmp_path):
    import av

    noise = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    # 10 fps for 1 s, nothing for 2.5 s (a recorder that stalled), then 10 fps again; B-frames (qp 1)
    times = [k for k in range(10)] + [35 + k for k in range(10)]
    gapped = tmp_path / "gap.mp4"
    write_video(gapped, [(t, marked(i, noise)) for i, t in enumerate(times)], rate=10,
                options={"qp": "1", "preset": "ultrafast", "x264-params": "bframes=2"})
    with av.open(str(gapped)) as container:
        packets = [(p.pts, p.dts) for p in container.demux(video=0) if p.size]
    assert any(pts != dts for pts, dts in packets)  # stored in decode order: the decoder reorders
    # the frame before the gap is held across it; every frame lands on its own time
    assert marks(iter_frames(gapped, 10.0)) == list(range(10)) + [9] * 25 + list(range(10, 20))
    notes: list[str] = []
    assert len(list(iter_frames(gapped, 10.0, notes))) == 45
    assert notes == ["video timestamp gaps: 1 longer than 1 s (longest 2.60 s, 0.90-3.50 s); the frame before "
                     "each gap is held across it"]
    # a raw H.264 stream has no timestamps: frames follow each other by the codec's frame duration (1/30 s)
    raw = tmp_path / "raw.h264"
    write_video(raw, [(k, marked(k, noise)) for k in range(20)], options={"qp": "1", "preset": "ultrafast"},
                container_format="h264")
    assert marks(iter_frames(raw, 15.0)) == list(range(0, 20, 2))
    notes = []
    assert len(list(iter_frames(raw, 15.0, notes))) == 10
    assert notes == ["video frames without a timestamp: 20; each is placed one frame duration (the codec's, else "
                     "1 / the average rate of 25 fps) after the frame before it"]


def test_a_rotated_phone_video_is_turned_upright(tmp_path):
    """A portrait phone video is stored landscape with a rotation in its display matrix; frames come out
    upright, as OpenCV shows them."""
    import av
    import cv2

    noise = np.random.default_rng(1).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    video = tmp_path / "portrait.mp4"
    with av.open(str(video), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.options = {"qp": "0", "preset": "ultrafast"}
        stream.set_display_rotation(90)
        for k in range(5):
            frame = av.VideoFrame.from_ndarray(noise, format="bgr24")
            frame.pts, frame.time_base = k, Fraction(1, 10)
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    ours = [image for _, _, image in iter_frames(video, 10.0)]
    capture = cv2.VideoCapture(str(video))
    theirs = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        theirs.append(image)
    assert len(ours) == len(theirs) == 5 and ours[0].shape == (64, 48, 3)
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_frames_a_decoder_gives_out_of_order_are_put_back_or_left_out(tmp_path, monkeypatch):
    """A decoder without reorder information gives frames out of presentation order: neighbours swapped
    are put back in order; a frame that comes more than REORDER_FRAMES late is left out and reported."""
    from empathic_fusion.features import media

    noise = np.random.default_rng(2).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    video = tmp_path / "clip.mp4"
    write_video(video, [(k, marked(k, noise)) for k in range(20)], rate=10)
    decoded = media._decoded_frames
    order = [1, 0, 3, 2, 4, 5] + list(range(7, 19)) + [6, 19]  # frame 6 comes after frame 18

    def out_of_order(container, stream, problems):
        frames = list(decoded(container, stream, problems))
        return (frames[i] for i in order)

    monkeypatch.setattr(media, "_decoded_frames", out_of_order)
    notes: list[str] = []
    assert marks(iter_frames(video, 10.0, notes)) == [0, 1, 2, 3, 4, 5, 5] + list(range(7, 20))
    assert notes == [f"video frames out of timestamp order: 1 with a time at or before a frame already placed "
                     f"(after reordering up to {media.REORDER_FRAMES} frames); they are left out"]


@real_face
def test_a_resolution_change_keeps_the_participants_face_and_is_reported(tmp_path):
    """Two recordings joined (MPEG-TS segments, as the concat demuxer joins encodes): 4 s at 640x360, then 4 s
    at 320x180 of the same face. The face is followed in proportion to the frame, so every frame after the
    change keeps the participant's face (in pixels the same face looked like a jump to someone else's), and
    the change is reported with its time."""
    import cv2

    from empathic_fusion.features.face_mesh import FOUND, FaceMeshTracker

    big = face_frames((640, 360))
    video = tmp_path / "joined.ts"
    parts = []
    for k, size in enumerate(((640, 360), (320, 180))):
        part = tmp_path / f"part{k}.ts"
        frames = [(pts, cv2.resize(ping_pong(big, pts), size, interpolation=cv2.INTER_AREA))
                  for pts in range(60 * k, 60 * (k + 1))]
        write_video(part, frames, rate=15, options={"qp": "10", "preset": "ultrafast"}, container_format="mpegts")
        parts.append(part.read_bytes())
    video.write_bytes(b"".join(parts))
    notes: list[str] = []
    tracker = FaceMeshTracker()
    outcomes, sizes = [], set()
    for target, _, frame in iter_frames(video, 15.0, notes):
        tracker.landmarks(frame, target / 15.0)
        outcomes.append(tracker.outcome)
        sizes.add(frame.shape[:2])
    tracker.close()
    assert sizes == {(360, 640), (180, 320)} and len(outcomes) >= 118
    assert outcomes.count(FOUND) == len(outcomes), [i for i, o in enumerate(outcomes) if o != FOUND]
    assert any(n.startswith("video resolution changes: 640x360 -> 320x180 at 4.0") for n in notes), notes


@real_face
def test_an_empty_or_cut_short_file_is_named_as_such(tmp_path):
    """FFmpeg says "Invalid data found when processing input" for both; the message says what happened to the file
    (an MP4 cut before its index was written, an empty copy) and what to do, for video and audio alike."""
    from empathic_fusion.features.media import MediaError, load_audio

    whole = (MEDIA / "single_face.mp4").read_bytes()
    (tmp_path / "cut.mp4").write_bytes(whole[: len(whole) // 3])  # its 'moov' index is at the end
    (tmp_path / "empty.mp4").write_bytes(b"")
    with pytest.raises(MediaError, match=r"cut\.mp4: the file is cut short or damaged: FFmpeg finds no readable header "
                                         r"in its \d+ bytes .*has no index \(its 'moov' atom\)"):
        probe_video(tmp_path / "cut.mp4")
    for read in (probe_video, load_audio):
        with pytest.raises(MediaError, match=r"empty\.mp4: the file is empty \(0 bytes\): .*copy it again"):
            read(tmp_path / "empty.mp4")
