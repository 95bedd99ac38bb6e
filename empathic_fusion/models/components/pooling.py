"""Masked pooling over time: summaries that only valid frames contribute to."""
from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x (B, T, F) over the frames where mask (B, T) is True; a window with no valid frame
    gives zeros (not NaN), so a modality missing for a whole window contributes nothing.

    One batched matrix product (mask weights x frames) reads x once, instead of masking a copy
    of it and summing that."""
    weight = mask.to(x.dtype)
    count = weight.sum(dim=1, keepdim=True).clamp(min=1.0)
    return torch.bmm(weight.unsqueeze(1), x).squeeze(1) / count
