"""Masked pooling over time: summaries that only valid frames contribute to."""
from __future__ import annotations

import torch

from src.models.components.encoders import masked


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x (B, T, F) over the frames where mask (B, T) is True; a window with no valid frame
    gives zeros (not NaN), so a modality missing for a whole window contributes nothing."""
    weight = mask.to(x.dtype)
    count = weight.sum(dim=1, keepdim=True).clamp(min=1.0)
    return masked(x, mask).sum(dim=1) / count
