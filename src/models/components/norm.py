"""Per-feature batch normalisation that ignores masked frames.

`nn.BatchNorm1d(seq_len)` applied to (B, T, F) treats time steps as channels (one mean per frame
position, mixing unrelated features): a known bug in a popular EF-LSTM implementation. This norm
keeps one statistic per *feature*, pooled over every valid frame in the batch, so padding and
frames without a face or speech neither shift the statistics nor receive a value.
"""
from __future__ import annotations

import torch
from torch import nn

from src.models.components.encoders import masked


class MaskedBatchNorm(nn.Module):
    def __init__(self, num_features: int, momentum: float = 0.1, eps: float = 1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, F) with mask (B, T) -> normalised x, zero where masked."""
        x = masked(x, mask)
        weight = mask.unsqueeze(-1).to(x.dtype)
        n = weight.sum()
        if self.training and n > 1:  # batch statistics over valid frames only
            mean = x.sum(dim=(0, 1)) / n
            var = ((x - mean) * weight).pow(2).sum(dim=(0, 1)) / n
            with torch.no_grad():
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(var * n / (n - 1), self.momentum)
        else:  # evaluation, or too few valid frames to estimate a variance
            mean, var = self.running_mean, self.running_var
        normed = (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias
        return normed * weight
