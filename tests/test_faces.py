"""Whose face and which frames: with two people in view the participant's face is followed and never
switched for the other one (frames with more than one face reported); a covered camera or an empty view
is masked in the face and CNN branches, and long masked stretches are reported with their times."""
from __future__ import annotations

import numpy as np
import pytest

from empathic_fusion.features.face_mesh import FOLLOW_SECONDS, FaceMeshTracker
from tests.test_video_timestamps import face_frames, ping_pong, real_face, write_video

POSE_TX = 3  # head-pose translation x (metres of the generic face): < 0 left of the camera's axis


def two_people(participant_left: bool) -> list[tuple[int, np.ndarray]]:
    """3 s at 15 fps of the participant beside a second, smaller person (single_face.mp4 mirrored, 0.9x);
    the participant's face is covered from 1.0 to 1.4 s, so only the other face is in view then."""
    import cv2

    faces = face_frames((640, 360))
    frames = []
    for k in range(45):
        participant = ping_pong(faces, k).copy()
        if 15 <= k < 21:
            participant[:, 180:460] = 128
        other = np.full_like(participant, 90)
        other[18:342, 32:608] = cv2.resize(ping_pong(faces, k + 30)[:, ::-1], (576, 324), interpolation=cv2.INTER_AREA)
        frames.append((k, np.concatenate([participant, other] if participant_left else [other, participant], axis=1)))
    return frames


@real_face
@pytest.mark.parametrize("participant_left", [True, False])
def test_two_faces_in_view_the_participants_is_followed_and_reported(tmp_path, participant_left):
    from empathic_fusion.features.video_pass import extract_video

    video = tmp_path / "two.mp4"
    write_video(video, two_people(participant_left), rate=15)
    arrays, info, notes = extract_video(video, 15.0, face_cfg={})["face"]
    mask, tx = arrays["mask"], arrays["features"][:, POSE_TX].astype(np.float32)
    covered = np.zeros(45, dtype=bool)
    covered[15:21] = True
    # the larger face is taken first, then followed: never the other person's, also while the
    # participant's face is covered (only the other face in view: masked, not switched to)
    side = tx[mask == 1] < 0 if participant_left else tx[mask == 1] > 0
    assert side.all() and mask[~covered].all() and not mask[covered].any()
    assert info["multi_face_frames"] == 39
    assert notes == ["more than one face in 39 of 45 frames (86.7%); the participant's face is followed by its "
                     "position from frame to frame, the others are not used; 6 frames showed only other faces "
                     "and are masked"]


def test_the_participant_is_chosen_by_size_and_centrality_then_followed_by_position():
    tracker = FaceMeshTracker.__new__(FaceMeshTracker)  # the choice alone, without the mesh
    tracker._followed = None

    def face(x: float, y: float, size: float) -> np.ndarray:
        points = np.zeros((478, 3))
        points[0, :2], points[1, :2] = (x - size / 2, y - size / 2), (x + size / 2, y + size / 2)
        points[2:, :2] = (x, y)
        return points

    small_centre, large_side, far_left = face(320, 180, 80), face(480, 180, 160), face(60, 180, 100)
    choose = lambda faces, t: tracker._participant(faces, 640, 360, t)  # noqa: E731
    assert choose([small_centre, large_side], 0.0) is large_side  # size x centrality: 160 x 0.56 beats 80 x 1.0
    moved = face(500, 190, 158)
    assert choose([small_centre, moved], 0.1) is moved  # nearest to where it was, though not the best score
    assert choose([far_left], 0.2) is None  # someone else while the participant is not in view
    assert choose([far_left], 0.1 + FOLLOW_SECONDS + 0.05) is far_left  # lost too long: chosen again


def covered_and_empty() -> list[tuple[int, np.ndarray]]:
    """12 s at 15 fps: the participant (0-2 s), a covered lens (near-black, 2-6 s), an empty textured view
    without a face (6-10 s), the participant again (10-12 s)."""
    faces = face_frames()
    rng = np.random.default_rng(0)
    dark = np.clip(rng.normal(12, 1.5, faces[0].shape), 0, 255).astype(np.uint8)
    empty = rng.integers(0, 255, faces[0].shape, dtype=np.uint8)
    return [(k, ping_pong(faces, k) if k < 30 or k >= 150 else dark if k < 90 else empty) for k in range(180)]


@real_face
def test_a_covered_camera_and_an_empty_view_are_masked_and_reported(tmp_path):
    from empathic_fusion.features.cnn_frames import FrameEmbedder
    from empathic_fusion.features.video_pass import extract_video

    video = tmp_path / "covered.mp4"
    write_video(video, covered_and_empty(), rate=15)
    embedder = FrameEmbedder(device="cpu", batch_size=8)
    out = extract_video(video, 15.0, face_cfg={}, cnn_cfg={"frame_stride": 5}, embedder=embedder)
    (face, _, face_notes), (cnn, cnn_info, cnn_notes) = out["face"], out["cnn"]
    seen = np.r_[np.ones(30), np.zeros(120), np.ones(30)].astype(np.uint8)
    assert np.array_equal(face["mask"], seen) and np.array_equal(cnn["mask"], seen)
    assert not cnn["features"][30:150].any() and cnn_info["constant_frames"] == 60
    assert face_notes == ["no participant face for more than 3 s at a time: 2.00-10.00 s (120 frames); those "
                          "frames are masked"]
    assert cnn_notes == ["CNN frames masked for more than 3 s at a time: 2.00-10.00 s (120 frames: 60 near-constant "
                         "image (black or covered camera), 60 no participant face); those frames get CNN mask 0"]
    # without the face rule the empty view is embedded; the covered lens stays masked by its image alone
    cnn, _, cnn_notes = extract_video(video, 15.0, cnn_cfg={"frame_stride": 5, "mask_without_face": False},
                                      embedder=embedder)["cnn"]
    assert np.array_equal(cnn["mask"], np.r_[np.ones(30), np.zeros(60), np.ones(90)].astype(np.uint8))
    assert cnn_notes == ["CNN frames masked for more than 3 s at a time: 2.00-6.00 s (60 frames: 60 near-constant "
                         "image (black or covered camera)); those frames get CNN mask 0"]
