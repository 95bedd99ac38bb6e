"""Per-feature batch normalisation that ignores masked frames.

`nn.BatchNorm1d(seq_len)` applied to (B, T, F) treats time steps as channels (one mean per frame
position, mixing unrelated features): a known bug in a popular EF-LSTM implementation. This norm
keeps one statistic per *feature*, pooled over every valid frame in the batch, so padding and
frames without a face or speech neither shift the statistics nor receive a value.

On a GPU a small model's step costs about one launch per kernel, so the norms of a model run together,
in few kernels whatever the number of modalities: the modalities' frames are concatenated once, each
statistic is one reduction over all their columns, and the normalisation and affine are one expression.
The statistics take no part in the backward unless the inputs need a gradient: the inputs of a fusion
model are data, so the weights' and biases' gradients (sums of the output gradient) are all the backward
computes. Nothing reads a value on the host (no `nonzero`, no count of valid frames): the rule that batch
statistics need two valid frames (with fewer, or in evaluation, the running ones are used) is a
device-side blend, so a step stays free of host syncs and traces as one graph.
"""
from __future__ import annotations

import torch
from torch import nn


class MaskedBatchNorm(nn.Module):
    """BatchNorm1d over the valid frames only: torch's statistics (biased variance to normalise, the
    unbiased one into the running average, `momentum` as BatchNorm's), from sums over the valid frames."""

    def __init__(self, num_features: int, momentum: float = 0.1, eps: float = 1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, F) with mask (B, T) -> normalised x (in the weights' dtype), zero where masked."""
        return masked_norms_concatenated([self], [x], [mask])


_COLUMNS: dict[tuple[tuple[int, ...], str], torch.Tensor] = {}


def _columns(widths: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Which norm each column of the concatenated features belongs to (made once per widths and device, so
    a captured step never copies it from the host)."""
    key = (widths, str(device))
    if key not in _COLUMNS:
        _COLUMNS[key] = torch.repeat_interleave(torch.arange(len(widths)), torch.tensor(widths)).to(device)
    return _COLUMNS[key]


def _batch_statistics(frames: torch.Tensor, valid: torch.Tensor, running: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each column's mean and biased variance over its valid frames (`valid`, (N, C) bool), blended with the
    running ones (`running`, (2, C): mean and variance) where fewer than two frames are valid; and the
    running statistics as BatchNorm moves them (mean and unbiased variance), unmoved in those columns.
    Two passes (the mean, then the squares of the deviations from it), so that a variance small beside
    its mean keeps its digits."""
    n = valid.sum(dim=0, dtype=running.dtype)
    n_minus_1 = n - 1
    use_batch = n_minus_1.clamp(0.0, 1.0)  # 1 with two valid frames or more, else 0
    n = n.clamp(min=1.0)
    mean = torch.where(valid, frames, 0.0).sum(dim=0) / n
    var = torch.where(valid, frames - mean, 0.0).square().sum(dim=0) / n
    used = torch.lerp(running, torch.stack([mean, var]), use_batch)
    moved = torch.lerp(running, torch.stack([mean, var * n / n_minus_1.clamp(min=1.0)]), use_batch)
    return used[0], used[1], moved


def masked_norms_concatenated(norms: list[MaskedBatchNorm], xs: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat([norm(x, mask) ...], dim=-1) for inputs of equal (B, T), in one set of kernels: a (B, T, sum F)
    view of time-major memory (a batch-first LSTM reads it without a copy) in the norms' dtype, zero at each
    input's masked frames. The norms share one momentum and eps."""
    if len({(n.momentum, n.eps) for n in norms}) > 1:
        raise ValueError("masked_norms_concatenated: the norms must share momentum and eps")
    first = norms[0]
    widths = tuple(x.shape[-1] for x in xs)
    batch, frames = xs[0].shape[:2]
    dtype = first.weight.dtype
    compute = torch.promote_types(dtype, torch.float32)  # statistics in float32 at least
    with torch.autocast(xs[0].device.type, enabled=False):
        # time-major rows (T * B, sum F): one copy of every input, which the concatenation makes anyway
        x = torch.cat([x.transpose(0, 1).to(compute) for x in xs], dim=-1).view(frames * batch, -1)
        valid = torch.stack([mask.t() for mask in masks], dim=-1).view(frames * batch, -1)
        valid = valid.index_select(1, _columns(widths, x.device))  # (T * B, sum F) bool
        weight = torch.cat([n.weight for n in norms]).to(compute)
        bias = torch.cat([n.bias for n in norms]).to(compute)
        running = torch.cat([n.running_mean for n in norms] + [n.running_var for n in norms]).to(compute).view(2, -1)
        if first.training:
            with torch.set_grad_enabled(torch.is_grad_enabled() and any(t.requires_grad for t in xs)):
                mean, var, moved = _batch_statistics(x, valid, running)
            with torch.no_grad():
                states = [n.running_mean for n in norms] + [n.running_var for n in norms]
                torch._foreach_copy_(states, torch.lerp(running, moved, first.momentum).view(-1).split(widths * 2))
        else:
            mean, var = running[0], running[1]
        scale = weight * torch.rsqrt(var + first.eps)
        shift = torch.addcmul(bias, mean, scale, value=-1.0)
        out = torch.where(valid, torch.addcmul(shift, x, scale), 0.0).to(dtype)
    return out.view(frames, batch, -1).transpose(0, 1)
