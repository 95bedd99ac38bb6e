"""Fusion helpers shared by the models: the N-ary tensor (outer) product of TFN."""
from __future__ import annotations

import math

import torch


def tensor_fusion_size(dims: list[int]) -> int:
    """Length of the flattened fusion tensor: prod(d + 1) over the modality embeddings."""
    return math.prod(int(d) + 1 for d in dims)


def tensor_fusion(parts: list[torch.Tensor]) -> torch.Tensor:
    """TFN's fusion: append a constant 1 to each (B, d_i) embedding and take the outer product of
    all of them, flattened to (B, prod(d_i + 1)). The 1s keep every unimodal and every lower-order
    interaction term inside the product. Works for one, two or three modalities."""
    fused = None
    for part in parts:
        part = torch.cat([torch.ones_like(part[:, :1]), part], dim=1)
        fused = part if fused is None else torch.einsum("bi,bj->bij", fused, part).flatten(1)
    return fused
