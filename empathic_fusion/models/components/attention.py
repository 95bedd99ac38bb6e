"""Masked scaled dot-product self-attention over time (no learned projections, as in AMER)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_self_attention(x: torch.Tensor, mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(x x^T / temperature) x over the valid frames of x (B, T, D), for every frame.

    Masked frames are removed as keys, so they cannot influence any output. The outputs at masked frames
    are not meant to be used: pool with `masked_mean`, which leaves them out. A window whose frames are
    all masked attends over all of them, a finite result (never the NaN of a softmax over only -inf
    scores), which such pooling leaves out too.

    One fused attention kernel forward and one backward (torch's scaled_dot_product_attention with an
    additive mask), where the softmax written out takes about ten each.
    """
    keys = mask >= mask.any(dim=1, keepdim=True)  # a valid frame, or any frame of a window without one
    scores_bias = torch.where(keys, 0.0, float("-inf")).to(x.dtype)
    q = x.unsqueeze(1)  # one head
    return F.scaled_dot_product_attention(q, q, q, attn_mask=scores_bias[:, None, None, :],
                                          scale=1.0 / temperature).squeeze(1)
