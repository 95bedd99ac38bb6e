"""Memory of the video pass stays bounded for long sessions: the face branch's output is written row by row
in float16 (no per-frame float64 vectors held until the end), the CNN's embeddings come off the device a
chunk behind, into their rows in frame order, whatever the session's length or its declared frames, and a
large output written to disk while computed (frame_rows.py) equals the in-memory one."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from empathic_fusion.features import frame_rows
from empathic_fusion.features.face_mesh import FACE_DIM
from empathic_fusion.features.frame_rows import FrameRows, NpyFile
from empathic_fusion.features.video_pass import CHUNK_FRAMES, _CnnBuffer
from tests.test_video_timestamps import face_frames, ping_pong, real_face, write_video


class ArrayEmbedder:
    """A stand-in for FrameEmbedder with its batching interface: an image's "embedding" is its first
    `dim` pixel values, so every row says which image it came from."""

    def __init__(self, batch_size: int, dim: int = 5):
        self.batch_size, self.dim = batch_size, dim

    def submit(self, images: list[np.ndarray]) -> np.ndarray:
        return np.stack([image.reshape(-1)[:self.dim] for image in images]).astype(np.float32)

    @staticmethod
    def collect(pending: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(pending)


@pytest.mark.parametrize("on_disk", [False, True])
def test_cnn_rows_come_off_a_chunk_behind_into_their_frames_also_past_the_declared_count(tmp_path, monkeypatch,
                                                                                         on_disk):
    """Every 3rd frame embedded, the two after it repeating it, then a masked stretch: each frame gets its
    embedded frame's row (zero when masked), in memory or written to disk as they come."""
    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 1 if on_disk else frame_rows.SPILL_BYTES)
    embedder = ArrayEmbedder(batch_size=4)
    rows = FrameRows(0, (embedder.dim,), np.float16, tmp_path, "cnn", buffer_rows=32)  # no declared frame count
    buffer = _CnnBuffer(embedder, rows, n_frames=0)
    most_in_flight, embedded, shown = 0, -1, []
    for target in range(320):
        if 200 <= target < 230:
            embedded = -1  # masked (no face, a covered camera)
        elif target % 3 == 0 or embedded < 0:  # frame_stride 3; after a masked frame the next one
            buffer.add(target, np.full((2, 3), target % 251, dtype=np.uint8))
            embedded = target
        buffer.hold(target, embedded)
        shown.append(embedded)
        most_in_flight = max(most_in_flight, len(buffer.in_flight))
    features, held = buffer.finish(330)  # the stream ends with 10 frames that were never decoded
    # at most two chunks' batches wait on the device (the one just submitted and the one before it)
    assert most_in_flight <= 2 * CHUNK_FRAMES // embedder.batch_size
    assert buffer.count == len(range(0, 320, 3)) - len(range(201, 230, 3)) + 1  # and 230, after the stretch
    assert isinstance(features, NpyFile) == on_disk
    features = np.load(features.path) if on_disk else features
    shown = np.array(shown + [-1] * 10)
    assert shown[230] == 230 and shown[232] == 231 and np.array_equal(held, shown)
    expected = np.zeros((330, embedder.dim), dtype=np.float16)
    expected[shown >= 0] = (shown[shown >= 0] % 251)[:, None]
    assert features.dtype == np.float16 and np.array_equal(features, expected)


@real_face
def test_the_face_branch_holds_its_output_and_a_constant_not_a_vector_per_frame(tmp_path):
    """Traced (numpy and Python) memory of extract_video(face) for 6 s and 18 s of the same face, after a
    warm-up (the mesh's one-time allocations): the longer session's peak is higher by about its output's
    extra rows (float16 features and a mask byte: 2903 bytes a frame; 3081 measured), not by the float64
    vector per frame and the float32 copy it once held (20.6 kB a frame measured)."""
    from empathic_fusion.features.video_pass import extract_video

    faces = face_frames()

    def video(seconds: int):
        path = tmp_path / f"{seconds}.mp4"
        write_video(path, [(k, ping_pong(faces, k)) for k in range(15 * seconds)], rate=15)
        return path

    extract_video(video(1), 15.0, face_cfg={})
    peaks = {}
    for seconds in (6, 18):
        path = video(seconds)
        tracemalloc.start()
        try:
            arrays = extract_video(path, 15.0, face_cfg={})["face"][0]
            peaks[seconds] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert arrays["mask"].all() and arrays["features"].shape == (15 * seconds, FACE_DIM)
    extra_frames = 15 * 12
    assert 0 < peaks[18] - peaks[6] < 1.5 * extra_frames * (2 * FACE_DIM + 1)


@real_face
def test_rows_written_to_disk_while_extracted_equal_the_in_memory_outputs(tmp_path, monkeypatch):
    """The real clip's face and CNN outputs (every 3rd frame embedded, the others holding it) through rows
    written to disk: the same arrays, info and warnings as held in memory; without rows_dir they stay arrays."""
    import torch

    from empathic_fusion.features.cnn_frames import FrameEmbedder
    from empathic_fusion.features.video_pass import extract_video
    from tests.test_video_timestamps import MEDIA

    torch.manual_seed(0)
    embedder = FrameEmbedder(device="cpu", batch_size=4)
    video, cnn_cfg = MEDIA / "single_face.mp4", {"frame_stride": 3, "mask_without_face": False}
    held = extract_video(video, 15.0, face_cfg={}, cnn_cfg=cnn_cfg, embedder=embedder, rows_dir=tmp_path / "rows")
    monkeypatch.setattr(frame_rows, "SPILL_BYTES", 1)
    assert all(isinstance(held[b][0]["features"], np.ndarray) for b in ("face", "cnn"))  # small: in memory
    assert not (tmp_path / "rows").exists()
    assert isinstance(extract_video(video, 15.0, face_cfg={})["face"][0]["features"], np.ndarray)  # no rows_dir
    written = extract_video(video, 15.0, face_cfg={}, cnn_cfg=cnn_cfg, embedder=embedder, rows_dir=tmp_path / "rows")
    assert sorted(p.name for p in (tmp_path / "rows").iterdir()) == ["cnn.npy", "face.npy"]
    for branch in ("face", "cnn"):
        (arrays, info, notes), (ours, our_info, our_notes) = held[branch], written[branch]
        assert isinstance(ours["features"], NpyFile) and ours["features"].path == tmp_path / "rows" / f"{branch}.npy"
        assert np.array_equal(np.load(ours["features"].path), arrays["features"])
        assert arrays["features"].dtype == np.float16 and arrays["features"].any()
        assert np.array_equal(ours["mask"], arrays["mask"]) and our_info == info and our_notes == notes
