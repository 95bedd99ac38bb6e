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


_ONE_HOT: dict[tuple[tuple[int, ...], str, torch.dtype], torch.Tensor] = {}


def _one_hot(widths: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(norms, sum of widths): 1 where a column of the concatenated features belongs to the norm (made once per
    widths, device and dtype, so a captured step never copies it from the host)."""
    key = (widths, str(device), dtype)
    if key not in _ONE_HOT:
        _ONE_HOT[key] = torch.block_diag(*[torch.ones(1, w, dtype=dtype) for w in widths]).to(device)
    return _ONE_HOT[key]


def _deviations(frames: torch.Tensor, rows: torch.Tensor, one_hot: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    """frames - centre at each norm's valid frames, 0 where masked (`frames` is zero there): one product with the
    rows. Without a gradient it is written over `frames`, the caller's own copy (one pass less over the frames)."""
    centre = one_hot * centre
    if torch.is_grad_enabled():
        return torch.addmm(frames, rows, centre, alpha=-1.0)
    return frames.addmm_(rows, centre, alpha=-1.0)


def _batch_statistics(frames: torch.Tensor, rows: torch.Tensor, one_hot: torch.Tensor, running: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each column's mean over its valid frames (`frames` (N, C), zero where masked; `rows` (N, norms), 1 where a
    norm's frame is valid) and the frames' deviations from it; its mean and biased variance blended with the
    running ones (`running`, (2, C): mean and variance) where fewer than two frames are valid; and the running
    statistics as BatchNorm moves them (mean and unbiased variance), unmoved in those columns. Two passes (the
    mean, then the squares of the deviations from it), so that a variance small beside its mean keeps its digits.
    Returns (batch mean, deviations, mean used, variance used, running statistics moved)."""
    n = rows.sum(dim=0) @ one_hot
    n_minus_1 = n - 1
    use_batch = n_minus_1.clamp(0.0, 1.0)  # 1 with two valid frames or more, else 0
    n = n.clamp(min=1.0)
    mean = frames.sum(dim=0) / n
    deviations = _deviations(frames, rows, one_hot, mean)
    var = deviations.square().sum(dim=0) / n
    used = torch.lerp(running, torch.stack([mean, var]), use_batch)
    moved = torch.lerp(running, torch.stack([mean, var * n / n_minus_1.clamp(min=1.0)]), use_batch)
    return mean, deviations, used[0], used[1], moved


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
        # time-major rows (T * B, sum F), zero at masked frames: one copy of every input, as a concatenation makes
        x = torch.cat([torch.where(mask.t().unsqueeze(-1), x.transpose(0, 1).to(compute), 0.0)
                       for x, mask in zip(xs, masks)], dim=-1).view(frames * batch, -1)
        rows = torch.stack([mask.t() for mask in masks], dim=-1).view(frames * batch, -1).to(compute)
        one_hot = _one_hot(widths, x.device, compute)
        weight = torch.cat([n.weight for n in norms]).to(compute)
        bias = torch.cat([n.bias for n in norms]).to(compute)
        running = torch.cat([n.running_mean for n in norms] + [n.running_var for n in norms]).to(compute).view(2, -1)
        with torch.set_grad_enabled(torch.is_grad_enabled() and any(t.requires_grad for t in xs)):
            if first.training:
                centre, deviations, mean, var, moved = _batch_statistics(x, rows, one_hot, running)
            else:
                mean, var = running[0], running[1]
                centre, deviations = mean, _deviations(x, rows, one_hot, mean)
        if first.training:
            with torch.no_grad():
                states = [n.running_mean for n in norms] + [n.running_var for n in norms]
                torch._foreach_copy_(states, torch.lerp(running, moved, first.momentum).view(-1).split(widths * 2))
        scale = weight * torch.rsqrt(var + first.eps)
        # (x - mean) * scale + bias at the valid frames, from the deviations from `centre` (the batch's mean, which
        # is the mean used but in columns with fewer than two valid frames, where it is the running one)
        shift = torch.addcmul(bias, centre - mean, scale) if first.training else bias
        out = (deviations * scale).addmm_(rows, one_hot * shift).to(dtype)
    return out.view(frames, batch, -1).transpose(0, 1)
