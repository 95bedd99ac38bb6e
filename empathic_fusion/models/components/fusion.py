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
    interaction term inside the product. Works for one, two or three modalities.

    Each outer product is a batched matrix product of (B, n, 1) by (B, 1, d + 1): its backward is
    two more products, where a broadcast multiply would reduce a (B, n, d + 1) temporary."""
    fused, ones = None, torch.ones_like(parts[0][:, :1])
    for part in parts:
        part = torch.cat([ones, part], dim=1)
        fused = part if fused is None else torch.bmm(fused.unsqueeze(2), part.unsqueeze(1)).flatten(1)
    return fused
