"""The fast model components give what the straightforward versions they replaced gave: the LSTM
over the whole window read at `lengths` - 1 equals packing by lengths, the gathered native batch
norm equals masked element-wise statistics, the matrix-product masked mean equals masking and
summing. Outputs, gradients and running statistics, on masks with leading and trailing invalid
frames, all-invalid windows and windows of length 0 and full length."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from empathic_fusion.models.components.encoders import MaskedLSTMEncoder, masked
from empathic_fusion.models.components.norm import MaskedBatchNorm, masked_norms_concatenated
from empathic_fusion.models.components.pooling import masked_mean

T = 12


def _masks(n: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks (n, T) and lengths (n,): random gaps, leading/trailing invalid frames, an all-invalid
    window of full length, one of length 0, one fully valid."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    lengths[0], lengths[1], lengths[2] = T, 0, T
    mask = (torch.rand(n, T, generator=g) > 0.3) & (torch.arange(T) < lengths[:, None])
    mask[0] = False                      # no face / no speech in the whole window
    mask[2] = True                       # every frame valid
    mask[3, :4] = False                  # leading invalid frames
    mask[4, lengths[4] - 3:] = False     # trailing invalid frames inside the length
    return mask, lengths


def _packed_reference(lstm: nn.LSTM, x: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The encoder as it was: zero masked frames, pack by lengths (at least 1), final hidden state."""
    packed = pack_padded_sequence(masked(x, mask), lengths.clamp(min=1), batch_first=True, enforce_sorted=False)
    _, (hidden, _) = lstm(packed)
    return hidden[-1]


def _grads(output: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return list(torch.autograd.grad(output, tensors, torch.randn(output.shape, generator=g)))


@pytest.mark.parametrize("num_layers,dropout,training", [(1, 0.0, True), (3, 0.0, True), (2, 0.5, False)])
def test_lstm_over_the_whole_window_equals_packing_by_lengths(num_layers, dropout, training):
    torch.manual_seed(0)
    encoder = MaskedLSTMEncoder(5, 7, num_layers, dropout).train(training)
    mask, lengths = _masks()
    x = torch.randn(len(mask), T, 5, requires_grad=True)
    ours = encoder(x, mask, lengths)
    reference = _packed_reference(encoder.lstm, x, mask, lengths)
    assert ours.shape == (len(mask), 7)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
    params = [x, *encoder.parameters()]
    for got, expected in zip(_grads(ours, params), _grads(reference, params)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_lstm_lengths_beyond_the_window_are_an_error():
    encoder = MaskedLSTMEncoder(5, 7)
    mask, lengths = _masks()
    lengths[5] = T + 1
    with pytest.raises(RuntimeError, match=f"index {T} is out of bounds for dimension 1 with size {T}"):
        encoder(torch.randn(len(mask), T, 5), mask, lengths)


class _ElementwiseMaskedBatchNorm(MaskedBatchNorm):
    """The norm as it was: element-wise masked statistics over (B, T)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = masked(x, mask)
        weight = mask.unsqueeze(-1).to(x.dtype)
        n = weight.sum()
        if self.training and n > 1:
            mean = x.sum(dim=(0, 1)) / n
            var = ((x - mean) * weight).pow(2).sum(dim=(0, 1)) / n
            with torch.no_grad():
                self.running_mean.lerp_(mean, self.momentum)
                self.running_var.lerp_(var * n / (n - 1), self.momentum)
        else:
            mean, var = self.running_mean, self.running_var
        return ((x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias) * weight


@pytest.mark.parametrize("valid_frames", ["random", "one", "none"])
def test_masked_sum_batchnorm_equals_elementwise_masked_statistics(valid_frames):
    """Against the element-wise statistics in float64 (two float32 sums differ by more than rounding of
    the result where a feature's spread is small beside its mean), forward, backward and running stats."""
    mask, _ = _masks()
    if valid_frames != "random":  # too few valid frames for batch statistics: running ones are used
        mask = torch.zeros_like(mask)
        mask[3, 5] = valid_frames == "one"
    g = torch.Generator().manual_seed(1)
    x = torch.randn(len(mask), T, 4, generator=g) * torch.tensor([1.0, 5.0, 0.1, 2.0]) + 3.0
    x = torch.where(mask.unsqueeze(-1), x, torch.full_like(x, 1e4))  # masked frames must not matter
    ours, reference = MaskedBatchNorm(4), _ElementwiseMaskedBatchNorm(4).double()
    with torch.no_grad():
        for norm in (ours, reference):
            norm.weight.copy_(torch.tensor([1.5, 0.5, 2.0, 1.0]))
            norm.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
    for _ in range(2):  # two training steps: the running statistics follow the same path
        xs = [x.clone().requires_grad_(True), x.double().requires_grad_(True)]
        outs = [norm(xi, mask) for norm, xi in zip((ours, reference), xs)]
        torch.testing.assert_close(outs[0], outs[1].float(), rtol=1e-5, atol=1e-5)
        assert (outs[0][~mask] == 0).all()
        got = _grads(outs[0], [xs[0], ours.weight, ours.bias])
        expected = _grads(outs[1], [xs[1], reference.weight, reference.bias])
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b.float(), rtol=1e-4, atol=1e-5)
        assert (got[0][~mask] == 0).all()
    torch.testing.assert_close(ours.running_mean, reference.running_mean.float())
    torch.testing.assert_close(ours.running_var, reference.running_var.float())
    ours.eval(), reference.eval()
    torch.testing.assert_close(ours(x, mask), reference(x.double(), mask).float(), rtol=1e-5, atol=1e-5)


def test_matrix_product_masked_mean_equals_masking_and_summing():
    mask, _ = _masks()
    x = torch.randn(len(mask), T, 6, requires_grad=True)
    ours = masked_mean(x, mask)
    reference = masked(x, mask).sum(dim=1) / mask.sum(dim=1, keepdim=True).clamp(min=1)
    torch.testing.assert_close(ours, reference)
    assert (ours[0] == 0).all()  # no valid frame: zeros, not NaN
    torch.testing.assert_close(_grads(ours, [x])[0], _grads(reference, [x])[0])


def test_lstm_runs_under_cpu_bf16_autocast():
    """CPU bf16 autocast would send the unpacked LSTM to oneDNN, which fails without bf16
    instructions; the encoder keeps the LSTM in float32 on the CPU."""
    torch.manual_seed(0)
    encoder = MaskedLSTMEncoder(5, 7)
    mask, lengths = _masks()
    x = torch.randn(len(mask), T, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = encoder(x, mask, lengths)
    torch.testing.assert_close(out, encoder(x, mask, lengths))


@pytest.mark.parametrize("downstream", ["sum", "lstm"])
def test_norms_written_into_one_matrix_equal_concatenated_norms(downstream):
    """EF-LSTM's early fusion: the masked norms of several modalities written into one matrix equal
    torch.cat of the separate norms, forward and backward, for a batch-major gradient and for the
    time-major one an LSTM returns."""
    masks = [_masks(seed=s)[0] for s in range(3)]
    widths = [5, 2, 3]
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(len(masks[0]), T, w, generator=g) * 3 + 1 for w in widths]
    norms = [MaskedBatchNorm(w) for w in widths]
    lstm = nn.LSTM(sum(widths), 4, batch_first=True)
    results = []
    for fused in (True, False):
        inputs = [x.clone().requires_grad_(True) for x in xs]
        for norm in norms:
            norm.running_mean.zero_(), norm.running_var.fill_(1.0)
        if fused:
            frames = masked_norms_concatenated(norms, inputs, masks)
        else:
            frames = torch.cat([norm(x, m) for norm, x, m in zip(norms, inputs, masks)], dim=-1)
        out = lstm(frames)[0] if downstream == "lstm" else frames * torch.arange(frames.shape[-1])
        params = [p for norm in norms for p in (norm.weight, norm.bias)]
        results.append((frames.detach(), _grads(out, inputs + params), [n.running_mean.clone() for n in norms]))
    (frames, grads, running), (expected_frames, expected_grads, expected_running) = results
    # equal up to the order of float32 sums (a column's sum runs beside other columns' in the concatenation)
    torch.testing.assert_close(frames, expected_frames, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(running, expected_running):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("training", [True, False])
def test_the_data_only_backward_equals_autograds_bit_for_bit(training):
    """Inputs that are data take the hand-written backward of the norms' affine; inputs that need a gradient take
    autograd's. The outputs, the weights' and biases' gradients and the running statistics are equal bit for bit,
    with a modality of one valid frame (running statistics used) and one of none."""
    masks = [_masks(seed=s)[0] for s in range(3)]
    masks[1] = torch.zeros_like(masks[1])
    masks[1][2, 3] = True
    masks[2] = torch.zeros_like(masks[2])
    widths = [5, 2, 3]
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(len(masks[0]), T, w, generator=g) * 3 + 1 for w in widths]
    results = []
    for data_only in (True, False):
        torch.manual_seed(0)
        norms = [MaskedBatchNorm(w).train(training) for w in widths]
        with torch.no_grad():
            for norm in norms:
                norm.weight.uniform_(0.5, 1.5), norm.bias.uniform_(-1.0, 1.0), norm.running_var.uniform_(0.5, 2.0)
        inputs = [x if data_only else x.clone().requires_grad_(True) for x in xs]
        frames = masked_norms_concatenated(norms, inputs, masks)
        params = [p for norm in norms for p in (norm.weight, norm.bias)]
        grads = torch.autograd.grad((frames * torch.randn(frames.shape, generator=torch.Generator().manual_seed(4))).sum(),
                                    params)
        results.append([frames.detach(), *grads, *(b for norm in norms for b in (norm.running_mean, norm.running_var))])
    assert all(torch.equal(a, b) for a, b in zip(*results))
