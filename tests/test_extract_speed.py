"""Issue 26, part 2: the video branches at their networks' speed without changing what they compute
unnoticed. The one OpenCV resize stays close to the torch resize it replaced, bf16 stays close to
fp32 and is told apart in the store, `auto` settings resolve, and the batch size changes nothing."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from empathic_fusion.config.checks import ConfigError
from empathic_fusion.config.validate import typed
from empathic_fusion.features.cnn_frames import (AUTO_BATCH, INPUT_SIZE, FrameEmbedder, resize_frame,
                                                 resolve_batch_size, resolve_precision)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def photos() -> list[np.ndarray]:
    """Real photographs in BGR, as a decoder gives them, in two sizes."""
    import skimage.data

    return [np.ascontiguousarray(image[:, :, ::-1]) for image in
            (skimage.data.coffee(), skimage.data.astronaut(), skimage.data.chelsea(), skimage.data.rocket())]


@pytest.fixture(scope="module")
def fp32() -> FrameEmbedder:
    torch.manual_seed(0)
    return FrameEmbedder(device="cpu", precision="fp32")


def test_auto_settings_resolve_to_measured_per_device_values(fp32):
    assert fp32.batch_size == AUTO_BATCH["cpu"] and isinstance(fp32.batch_size, int)
    assert resolve_batch_size("auto", "cuda:0") == AUTO_BATCH["cuda"] and resolve_batch_size(7, "cpu") == 7
    assert resolve_precision("auto", "cpu") == "fp32" and resolve_precision("auto", "cuda") == "fp16"
    assert resolve_precision("bf16", "cpu") == "bf16"
    assert typed("features", {"cnn": {"batch_size": "auto", "precision": "bf16"}}).cnn.batch_size == "auto"
    for bad in ({"batch_size": "big"}, {"batch_size": 0}, {"precision": "int8"}):
        with pytest.raises(ConfigError):
            typed("features", {"cnn": bad})


def test_opencv_area_resize_is_deterministic_and_close_to_the_torch_resize_it_replaced(fp32, photos):
    """CNN_VERSION 2 resizes with OpenCV's area interpolation; the embedding stays near version 1's
    torch antialiased bilinear one (docs/results/extract.md measures it on video frames)."""
    import torch.nn.functional as F

    first, again = resize_frame(photos[0]), resize_frame(photos[0].copy())
    assert first.shape == (INPUT_SIZE, INPUT_SIZE, 3) and first.dtype == np.uint8 and np.array_equal(first, again)
    assert np.array_equal(fp32.embed(photos[:2]), fp32.embed(photos[:2]))
    x = torch.from_numpy(photos[0][None].copy()).permute(0, 3, 1, 2).flip(1).float()
    x = F.interpolate(x, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", antialias=True, align_corners=False)
    torch_resized = fp32.forward(((x - fp32._mean) / fp32._std).contiguous(memory_format=torch.channels_last))
    assert _cosines(fp32.embed(photos[:1]), torch_resized.numpy())[0] > 0.98


def test_bf16_stays_close_to_fp32_and_batch_size_changes_nothing(fp32, photos):
    reference = fp32.embed(photos)
    bf16 = FrameEmbedder(device="cpu", precision="bf16").embed(photos)
    assert bf16.dtype == np.float32 and _cosines(reference, bf16).min() >= 0.997  # 0.998-0.9998 here
    for batch in (1, 3):
        other = FrameEmbedder(device="cpu", precision="fp32", batch_size=batch).embed(photos)
        np.testing.assert_allclose(other, reference, rtol=1e-4, atol=1e-5)
    contiguous = FrameEmbedder(device="cpu", precision="fp32", channels_last=False).embed(photos)
    np.testing.assert_allclose(contiguous, reference, rtol=1e-3, atol=1e-4)


def test_a_bf16_store_is_not_read_as_fp32(tmp_path):
    from empathic_fusion.features.video_branches import _cnn_signature
    from empathic_fusion.features.store import FeatureStore

    store, video = FeatureStore(tmp_path / "store"), tmp_path / "clip.mp4"
    video.write_bytes(b"not really a video, but hashed all the same")
    cfg = {"model": "efficientnet_lite0", "weights_path": None, "crop": "frame", "frame_stride": 1,
           "mask_without_face": False, "min_frame_std": 5.0}
    face = {"min_detection_confidence": 0.5, "min_tracking_confidence": 0.5, "max_faces": 2}
    signature = {p: _cnn_signature(store, video, 15.0, {**cfg, "precision": p}, face)
                 for p in ("auto", "fp32", "bf16", "fp16")}
    assert signature["auto"] == signature["fp32"]
    assert set(signature["fp32"]["config"]) == {"fps", "crop", "frame_stride", "mask_without_face", "min_frame_std"}
    with_mesh = _cnn_signature(store, video, 15.0, {**cfg, "mask_without_face": True}, face)["config"]
    assert {k: with_mesh[k] for k in face} == face  # the mesh decides which frames are embedded
    assert signature["bf16"] != signature["fp32"] and signature["bf16"]["config"]["precision"] == "bf16"
    assert signature["fp16"] not in (signature["fp32"], signature["bf16"])


def test_landmarks_read_from_the_message_bytes_equal_the_loop():
    from mediapipe.framework.formats import landmark_pb2

    from empathic_fusion.features.face_mesh import landmark_array

    rng = np.random.default_rng(0)
    message = landmark_pb2.NormalizedLandmarkList()
    for x, y, z in rng.normal(size=(478, 3)).astype(np.float32):
        mark = message.landmark.add()
        mark.x, mark.y, mark.z = float(x), float(y), float(z)
    loop = np.array([(m.x, m.y, m.z) for m in message.landmark])
    assert np.array_equal(landmark_array(message), loop)
    message.landmark[5].visibility = 0.5  # another layout: the loop answers
    assert np.array_equal(landmark_array(message), loop)
    assert landmark_array(landmark_pb2.NormalizedLandmarkList()).shape == (0, 3)


def test_video_pass_reports_each_branchs_own_time(fp32, tmp_path):
    from empathic_fusion.demo.face import write_face_video
    from empathic_fusion.features.video_pass import extract_video

    n = 6
    video = tmp_path / "clip.avi"
    write_face_video(video, {"mouth_open": np.linspace(0, 1, n), "yaw": np.zeros(n), "face_visible": np.ones(n)},
                     fps=15)
    timings: dict[str, float] = {}
    out = extract_video(video, 15.0, face_cfg={}, cnn_cfg={"frame_stride": 2}, embedder=fp32, timings=timings)
    assert timings["decode_frames"] == timings["face_frames"] == n and timings["cnn_frames"] == n // 2
    assert min(timings["decode"], timings["face"], timings["cnn"]) > 0
    info = out["cnn"][1]
    assert info["precision"] == "fp32" and info["batch_size"] == AUTO_BATCH["cpu"]
