"""A plain ResNet50 (He et al., 2015) whose parameter names match torchvision's `resnet50`.

torchvision cannot be installed beside torch 2.13 here, and no ResNet50 weights ship on PyPI, so the
paper's 2048-d penultimate-layer features need the user's own weights file: a torchvision
`resnet50` state dict (e.g. `resnet50-11ad3fa6.pth`) loads into this definition unchanged.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from empathic_fusion.core.errors import MissingFileError


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int = 1):
        super().__init__()
        out = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        return self.relu(self.bn3(self.conv3(y)) + identity)


class ResNet50(nn.Module):
    """Backbone up to global average pooling: images (N, 3, H, W) -> (N, 2048)."""

    dim = 2048

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = 64
        for name, (width, blocks, stride) in zip(("layer1", "layer2", "layer3", "layer4"),
                                                 ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))):
            layers = []
            for i in range(blocks):
                layers.append(Bottleneck(channels, width, stride if i == 0 else 1))
                channels = width * Bottleneck.expansion
            setattr(self, name, nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)


def load_resnet50(weights_path: str | Path) -> ResNet50:
    """ResNet50 with a torchvision-layout state dict; the classifier (`fc.*`) is dropped."""
    path = Path(weights_path)
    if not path.is_file():
        raise MissingFileError(f"ResNet50 weights {path} do not exist (give a torchvision resnet50 state dict .pth)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    state = {k.removeprefix("module."): v for k, v in state.items() if not k.removeprefix("module.").startswith("fc.")}
    model = ResNet50()
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"{path} is not a torchvision resnet50 state dict: missing {result.missing_keys[:5]}, "
                         f"unexpected {result.unexpected_keys[:5]}")
    return model.eval()
