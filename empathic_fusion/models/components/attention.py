"""Masked scaled dot-product self-attention over time (no learned projections, as in AMER)."""
from __future__ import annotations

import torch


def masked_self_attention(x: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(x x^T / temperature) x over the valid frames of x (B, T, D).

    Masked frames are removed as keys, so they cannot influence any output. A window whose frames
    are all masked gets zeros instead of the NaN a softmax over only -inf scores would give.
    """
    scores = torch.matmul(x, x.transpose(1, 2)) / temperature
    keys = mask.unsqueeze(1)  # (B, 1, T): which frames may be attended to
    scores = scores.masked_fill(~keys, float("-inf"))
    any_key = mask.any(dim=1).view(-1, 1, 1)
    scores = torch.where(any_key, scores, torch.zeros_like(scores))  # all masked: no -inf row
    weights = torch.softmax(scores, dim=-1) * any_key.to(x.dtype)
    return torch.matmul(weights, x)
