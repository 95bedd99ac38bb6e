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
computes, by a hand-written backward (`_DataAffine`) equal to autograd's bit for bit in fewer kernels.
Nothing reads a value on the host (no `nonzero`, no count of valid frames): the rule that batch
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


_COLUMN_LAYOUTS: dict[tuple[tuple[int, ...], str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}


def _column_layout(widths: tuple[int, ...], device: torch.device, dtype: torch.dtype
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Which norm each column of the concatenated features belongs to, as (norms, sum of widths) one-hot rows in
    `dtype` and as (1, sum of widths) indices, made once per widths, device and dtype, so a captured step never
    copies them from the host."""
    key = (widths, str(device), dtype)
    if key not in _COLUMN_LAYOUTS:
        one_hot = torch.block_diag(*[torch.ones(1, w, dtype=dtype) for w in widths])
        _COLUMN_LAYOUTS[key] = one_hot.to(device), one_hot.argmax(dim=0, keepdim=True).to(device)
    return _COLUMN_LAYOUTS[key]


def _deviations(frames: torch.Tensor, rows: torch.Tensor, one_hot: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    """frames - centre at each norm's valid frames, 0 where masked (`frames` is zero there): one product with the
    rows. Without a gradient it is written over `frames`, the caller's own copy (one pass less over the frames)."""
    centre = one_hot * centre
    if torch.is_grad_enabled():
        return torch.addmm(frames, rows, centre, alpha=-1.0)
    return frames.addmm_(rows, centre, alpha=-1.0)


def _batch_statistics(frames: torch.Tensor, rows: torch.Tensor, one_hot: torch.Tensor, running: torch.Tensor,
                      momentum: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each column's mean over its valid frames (`frames` (N, C), zero where masked; `rows` (N, norms), 1 where a
    norm's frame is valid) and the frames' deviations from it; its mean and biased variance blended with the
    running ones (`running`, (2, C): mean and variance) where fewer than two frames are valid; and the running
    statistics as BatchNorm moves them (mean and unbiased variance), unmoved in those columns. Two passes (the
    mean, then the squares of the deviations from it), so that a variance small beside its mean keeps its digits.
    Returns (batch mean, deviations, mean used, variance used, and the running statistics after a step of
    `momentum`). The running step is one lerp: where batch statistics are used its weight is `momentum`, where
    they are not it is 0 (BatchNorm's step towards the moved statistics, which equal the running ones there)."""
    n = torch.mm(rows.sum(dim=0, keepdim=True), one_hot).view(-1)
    n_minus_1 = n - 1
    use_batch = n_minus_1.clamp(0.0, 1.0)  # 1 with two valid frames or more, else 0
    n = n.clamp(min=1.0)
    mean = frames.sum(dim=0) / n
    deviations = _deviations(frames, rows, one_hot, mean)
    var = deviations.square().sum(dim=0) / n
    batch = torch.stack([mean, var, var * n / n_minus_1.clamp(min=1.0)])  # mean, biased and unbiased variance
    used = torch.lerp(running, batch[:2], use_batch)
    stepped = torch.lerp(running, batch[0::2], use_batch * momentum)
    return mean, deviations, used[0], used[1], stepped


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
        one_hot, norm_of_column = _column_layout(widths, x.device, compute)
        affine = torch.cat([n.weight for n in norms] + [n.bias for n in norms]).to(compute).view(2, -1)
        running = torch.cat([n.running_mean for n in norms] + [n.running_var for n in norms]).to(compute).view(2, -1)
        data_only = not any(t.requires_grad for t in xs)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not data_only):
            if first.training:
                centre, deviations, mean, var, stepped = _batch_statistics(x, rows, one_hot, running, first.momentum)
            else:
                mean, var = running[0], running[1]
                centre, deviations = mean, _deviations(x, rows, one_hot, mean)
        if first.training:
            with torch.no_grad():
                states = [n.running_mean for n in norms] + [n.running_var for n in norms]
                torch._foreach_copy_(states, stepped.view(-1).split(widths * 2))
        rstd = torch.rsqrt(var + first.eps)
        # (x - mean) * scale + bias at the valid frames, from the deviations from `centre` (the batch's mean, which
        # is the mean used but in columns with fewer than two valid frames, where it is the running one)
        offset = centre - mean if first.training else None
        if data_only and torch.is_grad_enabled() and affine.requires_grad:
            out = _DataAffine.apply(deviations, rows, one_hot, norm_of_column, affine, rstd, offset)
        else:
            out = _affine(deviations, rows, one_hot, affine, rstd, offset)
    return out.to(dtype).view(frames, batch, -1).transpose(0, 1)


def _affine(deviations: torch.Tensor, rows: torch.Tensor, one_hot: torch.Tensor, affine: torch.Tensor,
            rstd: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """deviations * scale + shift at the valid frames (0 where masked): scale = weight * rstd, shift = bias +
    offset * scale (offset None: bias)."""
    scale = affine[0] * rstd
    shift = affine[1] if offset is None else torch.addcmul(affine[1], offset, scale)
    return (deviations * scale).addmm_(rows, one_hot * shift)


class _DataAffine(torch.autograd.Function):
    """`_affine` when only the weights and biases need a gradient (the inputs of a fusion model are data): the
    backward autograd would make, op for op in the same order (so the gradients are equal bit for bit), less
    what it spends on the structure of the forward: the shifts' gradients are read from one product with the
    rows (a gather, where autograd multiplies by the one-hot matrix and sums), and the weights' and biases'
    gradients are written into one tensor, the gradient of their concatenation."""

    @staticmethod
    def forward(ctx, deviations, rows, one_hot, norm_of_column, affine, rstd, offset):
        ctx.save_for_backward(deviations, rows, norm_of_column, rstd, offset)
        return _affine(deviations, rows, one_hot, affine, rstd, offset)

    @staticmethod
    def backward(ctx, grad):
        deviations, rows, norm_of_column, rstd, offset = ctx.saved_tensors
        grad_affine = torch.empty(2, grad.shape[-1], dtype=grad.dtype, device=grad.device)
        grad_shift = torch.gather(torch.mm(rows.t(), grad), 0, norm_of_column, out=grad_affine[1:])[0]
        grad_scale = (grad * deviations).sum(dim=0)
        if offset is not None:
            grad_scale = grad_scale + grad_shift * offset
        torch.mul(grad_scale, rstd, out=grad_affine[0])
        return None, None, None, None, grad_affine, None, None
