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


def _batch_statistics(norm: MaskedBatchNorm, x: torch.Tensor, mask: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean and variance over the valid frames of x (B, T, F), or the running ones where fewer than two
    frames are valid, and the running statistics updated as BatchNorm does; with `1 / n` where the
    batch's statistics were used, else 0 (the backward pass follows them only then)."""
    w = mask.reshape(1, -1).to(x.dtype)
    count = w.sum()
    n = count.clamp(min=1.0)
    flat = x.reshape(-1, x.shape[-1])
    # the mean of the frames, corrected by the mean of their deviations from it (one more product over
    # the deviations the variance needs anyway: a float32 sum of many frames is not exact)
    first = torch.mm(w, flat).squeeze(0) / n
    deviations = flat - first
    correction = torch.mm(w, deviations).squeeze(0) / n
    var = torch.mm(w, deviations.square_()).squeeze(0).div_(n).sub_(correction.square()).clamp_(min=0.0)
    use_batch = count > 1
    mean = torch.where(use_batch, first + correction, norm.running_mean)
    unbiased = var * (count / (count - 1).clamp(min=1.0))
    var = torch.where(use_batch, var, norm.running_var)
    with torch.no_grad():  # a running statistic moves only with batch statistics (lerp towards itself: no move)
        norm.running_mean.lerp_(mean.to(norm.running_mean.dtype), norm.momentum)
        norm.running_var.lerp_(torch.where(use_batch, unbiased, norm.running_var).to(norm.running_var.dtype),
                               norm.momentum)
    return mean, var, torch.where(use_batch, 1.0 / n, 0.0)


class _MaskedNormsConcatenated(torch.autograd.Function):
    """Several masked batch norms written side by side into one time-major matrix, forward and backward
    by hand: the statistics are products of the mask row with the frames, and the output of norm i goes
    straight into its columns of a (T, B, sum F_i) tensor, returned as its (B, T, sum F_i) view (a
    batch-first LSTM reads that layout without a copy, and its input gradient comes back in it)."""

    @staticmethod
    def forward(ctx, norms: tuple[MaskedBatchNorm, ...], masks: tuple[torch.Tensor, ...], training: bool,
                *tensors: torch.Tensor) -> torch.Tensor:
        k = len(norms)
        xs, weights, biases = tensors[:k], tensors[k:2 * k], tensors[2 * k:]
        batch, frames = xs[0].shape[:2]
        widths = [x.shape[-1] for x in xs]
        # statistics in float32 at least; the output in the weights' dtype (float32 under autocast, which casts it
        # where the next op wants less; bfloat16 for a bfloat16 model)
        compute = torch.promote_types(weights[0].dtype, torch.float32)
        out = torch.empty((frames, batch, sum(widths)), dtype=weights[0].dtype, device=xs[0].device)
        saved, column = [], 0
        with torch.autocast(xs[0].device.type, enabled=False):  # statistics in float32, also under autocast
            for norm, x, mask, weight, bias in zip(norms, xs, masks, weights, biases):
                x = x.to(compute)
                if training:
                    mean, var, per_frame = _batch_statistics(norm, x, mask)
                else:
                    mean, var, per_frame = norm.running_mean.to(compute), norm.running_var.to(compute), None
                invstd = torch.rsqrt(var + norm.eps)
                scale = weight.to(compute) * invstd
                view = out[:, :, column: column + x.shape[-1]].transpose(0, 1)
                torch.addcmul(bias.to(compute) - mean * scale, x, scale, out=view)
                view.mul_(mask.unsqueeze(-1))
                saved += [x, mask, mean, invstd, scale, per_frame]
                column += x.shape[-1]
        ctx.save_for_backward(*saved)
        ctx.widths, ctx.dtypes, ctx.compute = widths, [t.dtype for t in tensors], compute
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors
        grads_x, grads_weight, grads_bias, column = [], [], [], 0
        for i, width in enumerate(ctx.widths):
            x, mask, mean, invstd, scale, per_frame = saved[6 * i: 6 * i + 6]
            g = grad[:, :, column: column + width].to(ctx.compute) * mask.unsqueeze(-1)  # masked frames got zeros
            grad_bias = g.sum(dim=(0, 1))
            grad_weight = (g * x).sum(dim=(0, 1)).sub_(mean * grad_bias).mul_(invstd)  # sum of g * xhat
            grad_x = g * scale
            if per_frame is not None:
                # batch statistics: BatchNorm's backward through the mean and variance too,
                # dx = scale * (g - (sum g) / n - xhat * (sum g * xhat) / n) over the valid frames, written as
                # scale * g + b * x + c per feature; per_frame (1 / n) is 0 where the running ones were used
                b = -scale * invstd * per_frame * grad_weight
                c = -scale * per_frame * grad_bias - b * mean
                grad_x.addcmul_(x, b).add_(c).mul_(mask.unsqueeze(-1))
            grads_x.append(grad_x)
            grads_weight.append(grad_weight)
            grads_bias.append(grad_bias)
            column += width
        grads = [g if g.dtype == dtype else g.to(dtype) for g, dtype in zip([*grads_x, *grads_weight, *grads_bias],
                                                                           ctx.dtypes)]
        return (None, None, None, *grads)


def masked_norms_concatenated(norms: list[MaskedBatchNorm], xs: list[torch.Tensor], masks: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat([norm(x, mask) ...], dim=-1) for inputs of equal (B, T), written once: a (B, T, sum F)
    view of time-major memory in the norms' dtype, zero at each input's masked frames."""
    training = norms[0].training
    return _MaskedNormsConcatenated.apply(tuple(norms), tuple(masks), training, *xs,
                                          *(n.weight for n in norms), *(n.bias for n in norms))
