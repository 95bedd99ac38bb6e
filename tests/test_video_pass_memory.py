"""Memory of the video pass stays bounded for long sessions: the face branch's output is written row by row
into one float16 array (no per-frame float64 vectors held until the end), and the CNN's embeddings come
off the device a chunk behind, into their rows, whatever the session's length or its declared frames."""
from __future__ import annotations

import tracemalloc

import numpy as np

from empathic_fusion.features.face_mesh import FACE_DIM
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


def test_cnn_rows_come_off_a_chunk_behind_into_their_frames_also_past_the_declared_count():
    embedder = ArrayEmbedder(batch_size=4)
    buffer = _CnnBuffer(embedder, n_frames=0)  # a stream that declares no frame count
    targets = list(range(0, 300, 3))
    most_in_flight = 0
    for target in targets:
        buffer.add(target, np.full((2, 3), target % 251, dtype=np.uint8))
        most_in_flight = max(most_in_flight, len(buffer.in_flight))
    features = buffer.finish()
    # at most two chunks' batches wait on the device (the one just submitted and the one before it)
    assert most_in_flight <= 2 * CHUNK_FRAMES // embedder.batch_size
    assert len(features) >= 298 and features.dtype == np.float16 and buffer.count == len(targets)
    expected = np.zeros((len(features), embedder.dim), dtype=np.float16)
    expected[targets] = np.array([[t % 251] * embedder.dim for t in targets], dtype=np.float32)
    assert np.array_equal(features, expected)


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
