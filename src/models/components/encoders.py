"""Per-modality sequence encoders shared by the fusion models."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


def masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Zero the frames whose mask is False, so masked frames carry no information."""
    return x * mask.unsqueeze(-1).to(x.dtype)


class MaskedLSTMEncoder(nn.Module):
    """LSTM over one modality's window: masked frames are zeroed, padding after `lengths` is skipped
    by packing, and the top layer's final hidden state summarises the window."""

    def __init__(self, input_dim: int, hidden_size: int, num_layers: int = 1, dropout: float = 0.0):
        super().__init__()
        self.lstm = nn.LSTM(input_dim, hidden_size, num_layers=num_layers, batch_first=True,
                            dropout=dropout if num_layers > 1 else 0.0)
        self.out_dim = hidden_size

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(masked(x, mask), lengths.clamp(min=1).cpu(), batch_first=True,
                                      enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)
        return hidden[-1]


def mlp(in_dim: int, hidden: int, out_dim: int, dropout: float) -> nn.Sequential:
    """Two-layer perceptron used after fusion."""
    return nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, out_dim))


def feedforward(dims: list[int], dropout: float = 0.0) -> nn.Sequential:
    """Linear layers through `dims` with ReLU (and dropout) between them, none after the last:
    a per-frame or per-window encoder whose depth is set by the config."""
    layers: list[nn.Module] = []
    for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
        if i:
            layers += [nn.ReLU(), nn.Dropout(dropout)] if dropout else [nn.ReLU()]
        layers.append(nn.Linear(int(d_in), int(d_out)))
    return nn.Sequential(*layers)
