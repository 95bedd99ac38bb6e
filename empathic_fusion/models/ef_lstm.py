"""Early-Fusion LSTM: the selected modalities concatenated per time step on the common 15 fps
clock -> one LSTM -> representation Z (as MMSA's EF_LSTM: final hidden state of the top layer ->
dropout -> Linear + ReLU).

Each modality is first normalised per feature over its valid frames (`MaskedBatchNorm`), not per
time step: `BatchNorm1d(seq_len)` in the popular implementation normalises frame positions, a
bug. These per-modality norms are the model's `encoders`; everything after is shared. The norms
write their modalities' columns of one time-major matrix that the LSTM reads as is
(`masked_norms_concatenated`): no concatenation copy and no transposition copy.
"""
from __future__ import annotations

import torch
from torch import nn

from empathic_fusion.core.registry import register_model
from empathic_fusion.models.components.encoders import MaskedLSTMEncoder, longest_lengths
from empathic_fusion.models.components.norm import MaskedBatchNorm, masked_norms_concatenated


@register_model("ef_lstm", module="fusion", display="EF-LSTM", paper_rank=2)
class EFLSTM(nn.Module):
    required_head: str | None = None  # any head of the config (models/contracts.py FusionNet)

    def __init__(self, modalities: list[str], input_dims: dict[str, int], hidden_size: int = 128,
                 num_layers: int = 4, dropout: float = 0.5):
        super().__init__()
        self.modalities = list(modalities)
        self.encoders = nn.ModuleDict({m: MaskedBatchNorm(int(input_dims[m])) for m in self.modalities})
        in_size = sum(int(input_dims[m]) for m in self.modalities)
        self.lstm = MaskedLSTMEncoder(in_size, hidden_size, num_layers, dropout)
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.out_dim = hidden_size

    def forward(self, batch: dict) -> torch.Tensor:
        # each norm zeroes its modality's masked frames, so a frame no modality has is all zeros already
        frames = masked_norms_concatenated([self.encoders[m] for m in self.modalities],
                                           [batch[m]["x"] for m in self.modalities],
                                           [batch[m]["mask"] for m in self.modalities])
        lengths = longest_lengths([batch[m]["lengths"] for m in self.modalities])
        hidden = self.lstm(frames, None, lengths)
        return self.dropout(torch.relu(self.linear(self.dropout(hidden))))
