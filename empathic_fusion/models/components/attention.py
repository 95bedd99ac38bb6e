"""Masked scaled dot-product self-attention over time (no learned projections, as in AMER)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_self_attention(x: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(x x^T / temperature) x over the valid frames of x (B, T, D).

    Masked frames are removed as keys, so they cannot influence any output. A window whose frames
    are all masked gets zeros instead of the NaN a softmax over only -inf scores would give.

    One fused attention kernel forward and one backward (torch's scaled_dot_product_attention with an
    additive mask), where the softmax written out takes about ten each: a window without a valid frame
    attends to all of its frames (a finite result, then zeroed), so no row of scores is all -inf.
    """
    has_key = mask.any(dim=1, keepdim=True)
    keys = mask >= has_key  # a valid frame, or any frame of a window without one
    scores_bias = torch.where(keys, 0.0, float("-inf")).to(x.dtype)
    q = x.unsqueeze(1)  # one head
    attended = F.scaled_dot_product_attention(q, q, q, attn_mask=scores_bias[:, None, None, :],
                                              scale=1.0 / temperature).squeeze(1)
    return torch.where(has_key.unsqueeze(-1), attended, 0.0)
