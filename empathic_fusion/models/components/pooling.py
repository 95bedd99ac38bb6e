"""Masked pooling over time: summaries that only valid frames contribute to."""
from __future__ import annotations

import torch


def _mean_weights(mask: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, counts) over the last dim of `mask` (..., T): 1 / count at the valid frames, 0 elsewhere (all 0
    for a window with no valid frame), and the count of valid frames (..., 1), in `dtype`."""
    counts = mask.sum(dim=-1, keepdim=True, dtype=dtype)
    return mask / counts.clamp(min=1.0), counts


def _pooled(weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One batched matrix product (mask weights x frames): reads x once, instead of masking a copy of it and
    summing that."""
    return torch.bmm(weights.unsqueeze(1), x).squeeze(1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x (B, T, F) over the frames where mask (B, T) is True; a window with no valid frame
    gives zeros (not NaN), so a modality missing for a whole window contributes nothing."""
    return _pooled(_mean_weights(mask, x.dtype)[0], x)


def masked_means(xs: list[torch.Tensor], masks: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """`masked_mean` of several modalities' windows (each (B, T, F_i) with mask (B, T), T shared), with the
    counts and weights of all of them computed together: the means, and (B, k) whether each window of each
    modality has a valid frame."""
    weights, counts = _mean_weights(torch.stack(masks), xs[0].dtype)  # (k, B, T), (k, B, 1)
    return [_pooled(weights[i], x) for i, x in enumerate(xs)], (counts.squeeze(-1) > 0).t()
