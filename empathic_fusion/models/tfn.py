"""Tensor Fusion Network (Zadeh et al., 2017), after the PyTorch port of the original code
(Justin1904/TensorFusionNetworks): audio and video are mean-pooled over their valid frames and
passed through a 3-layer subnetwork, text through an LSTM; a constant 1 is appended to each
embedding and their outer product (any 1-3 modalities) is flattened and mapped by the post-fusion
layers to Z. The original's third post-fusion layer (the sentiment output) is the head's job here.

The fused tensor grows multiplicatively, prod(d_m + 1): with the defaults 5 x 17 x 65 = 5,525.
It is bounded by `max_fused_size`: a config whose product exceeds it fails at construction and
names the sizes to shrink, instead of silently allocating a huge first post-fusion layer.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from empathic_fusion.core.registry import register_model
from empathic_fusion.models.components.encoders import MaskedLSTMEncoder, feedforward
from empathic_fusion.models.components.fusion import tensor_fusion, tensor_fusion_size
from empathic_fusion.models.components.norm import MaskedBatchNorm, masked_norms_concatenated
from empathic_fusion.models.components.pooling import masked_means

log = logging.getLogger(__name__)


class PooledSubNet(nn.Module):
    """TFN's audio/video subnetwork: time-average -> BatchNorm -> dropout -> 3 x (Linear + ReLU).
    Windows with no valid frame are left out of the batch statistics."""

    def __init__(self, input_dim: int, hidden: int, dropout: float):
        super().__init__()
        self.norm = MaskedBatchNorm(input_dim)
        self.drop = nn.Dropout(dropout)
        self.net = feedforward([input_dim, hidden, hidden, hidden])
        self.out_dim = hidden

    def forward(self, normed: torch.Tensor) -> torch.Tensor:
        """Dropout and the three layers, after the norm (TFN normalises its pooled modalities together)."""
        return torch.relu(self.net(self.drop(normed)))


class TextSubNet(nn.Module):
    """TFN's text subnetwork: LSTM -> final hidden state -> dropout -> Linear."""

    def __init__(self, input_dim: int, hidden: int, out: int, dropout: float):
        super().__init__()
        self.lstm = MaskedLSTMEncoder(input_dim, hidden)
        self.drop = nn.Dropout(dropout)
        self.linear = nn.Linear(hidden, out)
        self.out_dim = out

    def forward(self, x: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return self.linear(self.drop(self.lstm(x, mask, lengths)))


@register_model("tfn", module="fusion", display="TFN", paper_rank=1)
class TFN(nn.Module):
    required_head: str | None = None  # any head of the config (models/contracts.py FusionNet)

    def __init__(self, modalities: list[str], input_dims: dict[str, int], hidden_sizes: dict[str, int],
                 text_out: int = 64, dropouts: dict[str, float] | None = None, post_fusion_dim: int = 32,
                 max_fused_size: int = 65536):
        super().__init__()
        self.modalities = list(modalities)
        drop = {"audio": 0.3, "video": 0.3, "text": 0.3, "post_fusion": 0.3, **(dropouts or {})}
        self.encoders = nn.ModuleDict({
            m: TextSubNet(input_dims[m], int(hidden_sizes[m]), text_out, drop[m]) if m == "text"
            else PooledSubNet(input_dims[m], int(hidden_sizes[m]), drop[m])
            for m in self.modalities
        })
        dims = [self.encoders[m].out_dim for m in self.modalities]
        self.fused_size = tensor_fusion_size(dims)
        if self.fused_size > max_fused_size:
            raise ValueError(f"TFN fused tensor prod(d+1) over {dict(zip(self.modalities, dims))} = {self.fused_size} "
                             f"exceeds max_fused_size={max_fused_size}; shrink hidden_sizes/text_out")
        self.post_fusion = nn.Sequential(nn.Dropout(drop["post_fusion"]),
                                         nn.Linear(self.fused_size, post_fusion_dim), nn.ReLU(),
                                         nn.Linear(post_fusion_dim, post_fusion_dim), nn.ReLU())
        self.out_dim = post_fusion_dim
        log.info("TFN on %s: fused tensor %s = %d values, %d parameters",
                 "+".join(self.modalities), " x ".join(str(d + 1) for d in dims), self.fused_size,
                 sum(p.numel() for p in self.parameters()))

    def forward(self, batch: dict) -> torch.Tensor:
        pooled = [m for m in self.modalities if m != "text"]
        normed: dict[str, torch.Tensor] = {}
        if pooled:  # each pooled modality's mean over its valid frames as a one-frame window, normed together
            means, valid = masked_means([batch[m]["x"] for m in pooled], [batch[m]["mask"] for m in pooled])
            together = masked_norms_concatenated([self.encoders[m].norm for m in pooled], [x.unsqueeze(1) for x in means],
                                                 list(valid.unsqueeze(-1).unbind(1))).squeeze(1)
            normed = dict(zip(pooled, together.split([x.shape[-1] for x in means], dim=-1)))
        parts = [self.encoders[m](normed[m]) if m in normed  # the subnets in modality order (their dropout draws)
                 else self.encoders[m](batch[m]["x"], batch[m]["mask"], batch[m]["lengths"]) for m in self.modalities]
        return self.post_fusion(tensor_fusion(parts))
