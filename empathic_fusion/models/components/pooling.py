"""Masked pooling over time: summaries that only valid frames contribute to."""
from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x (B, T, F) over the frames where mask (B, T) is True; a window with no valid frame
    gives zeros (not NaN), so a modality missing for a whole window contributes nothing.

    One batched matrix product (mask weights x frames) reads x once, instead of masking a copy
    of it and summing that."""
    weight = mask / mask.sum(dim=1, keepdim=True, dtype=x.dtype).clamp(min=1.0)
    return torch.bmm(weight.unsqueeze(1), x).squeeze(1)


def masked_means(xs: list[torch.Tensor], masks: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """`masked_mean` of several modalities' windows (each (B, T, F_i) with mask (B, T), T shared), with the
    counts and weights of all of them computed together: the means, and (B, k) whether each window of each
    modality has a valid frame."""
    stacked = torch.stack(masks)  # (k, B, T)
    counts = stacked.sum(dim=2, keepdim=True, dtype=xs[0].dtype)
    weights = stacked / counts.clamp(min=1.0)
    means = [torch.bmm(weights[i].unsqueeze(1), x).squeeze(1) for i, x in enumerate(xs)]
    return means, (counts.squeeze(2) > 0).t()
