"""Per-feature batch normalisation that ignores masked frames.

`nn.BatchNorm1d(seq_len)` applied to (B, T, F) treats time steps as channels (one mean per frame
position, mixing unrelated features): a known bug in a popular EF-LSTM implementation. This norm
keeps one statistic per *feature*, pooled over every valid frame in the batch, so padding and
frames without a face or speech neither shift the statistics nor receive a value.

The statistics are masked sums (a matrix product of the mask weights with the frames), not a gather
of the valid frames: gathering needs their count on the host (`nonzero`), a host sync per norm and
step on a GPU and a break in a `torch.compile` graph. The rule that batch statistics need two valid
frames (with fewer, or in evaluation, the running ones are used) is a device-side choice (`torch.where`)
for the same reason.
"""
from __future__ import annotations

import torch
from torch import nn


class MaskedBatchNorm(nn.Module):
    """BatchNorm1d over the valid frames only: torch's statistics (biased variance to normalise, the
    unbiased one into the running average, `momentum` as BatchNorm's), computed as masked sums."""

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
    """Which norm each column of the concatenated features belongs to (made once per widths and device)."""
    key = (widths, str(device))
    if key not in _COLUMNS:
        _COLUMNS[key] = torch.repeat_interleave(torch.arange(len(widths)), torch.tensor(widths)).to(device)
    return _COLUMNS[key]


def _batch_statistics(norms: tuple[MaskedBatchNorm, ...], xs: list[torch.Tensor], masks: tuple[torch.Tensor, ...],
                      columns: torch.Tensor, running_mean: torch.Tensor, running_var: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every norm's mean and variance over its valid frames, side by side (one value per concatenated
    column), or its running ones where fewer than two frames are valid; the running statistics updated
    as BatchNorm does; and `1 / n` per column where the batch's statistics were used, else 0 (the backward
    pass follows them only then). Each sum is a product of a mask row with the frames: the mean, then the
    mean and the mean square of the deviations from it (which correct the first mean: a float32 sum of many
    frames is not exact, and a variance small beside the mean would lose its digits otherwise).
    `running_mean` and `running_var`: the norms' running statistics side by side, in the dtype computed in."""
    rows = torch.stack([mask.reshape(-1) for mask in masks]).to(running_mean.dtype)  # (norms, B * T) 0/1 weights
    counts = rows.sum(dim=1)[columns]
    n = counts.clamp(min=1.0)
    weights = rows.split(1)
    flats = [x.reshape(-1, x.shape[-1]) for x in xs]
    first = torch.cat([torch.mm(w, flat) for w, flat in zip(weights, flats)], dim=1).squeeze(0).div_(n)
    sums, squares, column = [], [], 0
    for w, flat in zip(weights, flats):
        deviations = flat - first[column: column + flat.shape[-1]]
        sums.append(torch.mm(w, deviations))
        squares.append(torch.mm(w, deviations.square_()))
        column += flat.shape[-1]
    shift = torch.cat(sums, dim=1).squeeze(0).div_(n)
    var = torch.cat(squares, dim=1).squeeze(0).div_(n).sub_(shift.square()).clamp_(min=0.0)
    use_batch = counts > 1
    mean = torch.where(use_batch, first + shift, running_mean)
    unbiased = torch.where(use_batch, var * counts / (counts - 1).clamp(min=1.0), running_var)
    var = torch.where(use_batch, var, running_var)
    momentum = norms[0].momentum
    with torch.no_grad():  # a running statistic moves only with batch statistics (lerp towards itself: no move)
        widths = [norm.running_mean.numel() for norm in norms]
        torch._foreach_copy_([norm.running_mean for norm in norms], running_mean.lerp(mean, momentum).split(widths))
        torch._foreach_copy_([norm.running_var for norm in norms], running_var.lerp(unbiased, momentum).split(widths))
    return mean, var, torch.where(use_batch, n.reciprocal(), 0.0)


class _MaskedNormsConcatenated(torch.autograd.Function):
    """Several masked batch norms written side by side into one time-major matrix, forward and backward
    by hand: the statistics of all of them are taken together (products of each mask row with its frames,
    then one set of operations on the concatenated per-feature values), and the output of norm i goes
    straight into its columns of a (T, B, sum F_i) tensor, returned as its (B, T, sum F_i) view (a
    batch-first LSTM reads that layout without a copy, and its input gradient comes back in it)."""

    @staticmethod
    def forward(ctx, norms: tuple[MaskedBatchNorm, ...], masks: tuple[torch.Tensor, ...], training: bool,
                *tensors: torch.Tensor) -> torch.Tensor:
        k = len(norms)
        xs, weights, biases = tensors[:k], tensors[k:2 * k], tensors[2 * k:]
        batch, frames = xs[0].shape[:2]
        widths = tuple(x.shape[-1] for x in xs)
        # statistics in float32 at least; the output in the weights' dtype (float32 under autocast, which casts it
        # where the next op wants less; bfloat16 for a bfloat16 model)
        compute = torch.promote_types(weights[0].dtype, torch.float32)
        out = torch.empty((frames, batch, sum(widths)), dtype=weights[0].dtype, device=xs[0].device)
        with torch.autocast(xs[0].device.type, enabled=False):  # statistics in float32, also under autocast
            xs = [x.to(compute) for x in xs]
            mean = torch.cat([norm.running_mean for norm in norms]).to(compute)
            var, per_frame = torch.cat([norm.running_var for norm in norms]).to(compute), None
            if training:
                mean, var, per_frame = _batch_statistics(norms, xs, masks, _columns(widths, xs[0].device), mean, var)
            invstd = torch.rsqrt(var + norms[0].eps)
            scale = torch.cat(weights).to(compute) * invstd
            shift = torch.cat(biases).to(compute) - mean * scale
            column = 0
            for x, mask in zip(xs, masks):
                view = out[:, :, column: column + x.shape[-1]].transpose(0, 1)
                torch.addcmul(shift[column: column + x.shape[-1]], x, scale[column: column + x.shape[-1]], out=view)
                view.mul_(mask.unsqueeze(-1))
                column += x.shape[-1]
        ctx.save_for_backward(mean, invstd, scale, per_frame, *xs, *masks)
        ctx.widths, ctx.dtypes, ctx.compute = widths, [t.dtype for t in tensors], compute
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        k = len(ctx.widths)
        mean, invstd, scale, per_frame, *rest = ctx.saved_tensors
        xs, masks = rest[:k], rest[k:]
        gs, sums, products, column = [], [], [], 0
        for x, mask, width in zip(xs, masks, ctx.widths):
            g = grad[:, :, column: column + width].to(ctx.compute) * mask.unsqueeze(-1)  # masked frames got zeros
            gs.append(g)
            sums.append(g.sum(dim=(0, 1)))
            products.append((g * x).sum(dim=(0, 1)))
            column += width
        grad_bias = torch.cat(sums)
        grad_weight = (torch.cat(products) - mean * grad_bias).mul_(invstd)  # sum of g * xhat
        if per_frame is not None:
            # batch statistics: BatchNorm's backward through the mean and variance too,
            # dx = scale * (g - (sum g) / n - xhat * (sum g * xhat) / n) over the valid frames, written as
            # scale * g + b * x + c per feature; per_frame (1 / n) is 0 where the running ones were used
            b = -scale * invstd * per_frame * grad_weight
            c = -scale * per_frame * grad_bias - b * mean
        grads_x, column = [], 0
        for x, mask, g, width in zip(xs, masks, gs, ctx.widths):
            part = slice(column, column + width)
            grad_x = g.mul_(scale[part])
            if per_frame is not None:
                grad_x.addcmul_(x, b[part]).add_(c[part]).mul_(mask.unsqueeze(-1))
            grads_x.append(grad_x)
            column += width
        grads = [*grads_x, *grad_weight.split(ctx.widths), *grad_bias.split(ctx.widths)]
        return (None, None, None, *(g if g.dtype == dtype else g.to(dtype) for g, dtype in zip(grads, ctx.dtypes)))


def masked_norms_concatenated(norms: list[MaskedBatchNorm], xs: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat([norm(x, mask) ...], dim=-1) for inputs of equal (B, T), written once: a (B, T, sum F)
    view of time-major memory in the norms' dtype, zero at each input's masked frames. The norms share
    one momentum and eps."""
    if len({(n.momentum, n.eps) for n in norms}) > 1:
        raise ValueError("masked_norms_concatenated: the norms must share momentum and eps")
    training = norms[0].training
    return _MaskedNormsConcatenated.apply(tuple(norms), tuple(masks), training, *xs,
                                          *(n.weight for n in norms), *(n.bias for n in norms))
