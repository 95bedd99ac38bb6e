"""Late-Fusion LSTM: one LSTM per selected modality over its own sequence; the final hidden
states are concatenated and an MLP maps them to the multimodal representation Z."""
from __future__ import annotations

import torch
from torch import nn

from empathic_fusion.core.registry import register_model
from empathic_fusion.models.components.encoders import MaskedLSTMEncoder, mlp


@register_model("lf_lstm", module="fusion", display="LF-LSTM", paper_rank=3)
class LFLSTM(nn.Module):
    required_head: str | None = None  # any head of the config (models/contracts.py FusionNet)

    def __init__(self, modalities: list[str], input_dims: dict[str, int], hidden_sizes: dict[str, int],
                 representation_dim: int = 128, post_fusion_hidden: int = 128, dropout: float = 0.1,
                 num_layers: int = 1):
        super().__init__()
        self.modalities = list(modalities)
        self.encoders = nn.ModuleDict({
            m: MaskedLSTMEncoder(input_dims[m], int(hidden_sizes[m]), num_layers, dropout) for m in self.modalities
        })
        fused = sum(e.out_dim for e in self.encoders.values())
        self.fusion = mlp(fused, post_fusion_hidden, representation_dim, dropout)
        self.out_dim = representation_dim

    def forward(self, batch: dict) -> torch.Tensor:
        states = [self.encoders[m](batch[m]["x"], batch[m]["mask"], batch[m]["lengths"]) for m in self.modalities]
        return self.fusion(torch.cat(states, dim=-1))
