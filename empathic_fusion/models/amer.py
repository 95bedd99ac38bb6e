"""Attention-based Multimodal Emotion Reasoning (AMER; Shen et al., 2020, MEmoR), after the
original code: per-modality frame encoders to 2*D_e, the person's personality (here the Big Five
and trait empathy, `batch["traits"]`, missing traits zeroed and flagged) encoded to 2*D_e and
concatenated to every modality token, masked scaled dot-product self-attention over time within
each modality (no learned projections, temperature sqrt(4*D_e)) with a residual connection, and
a linear fusion of the modalities to Z (4*D_e).

What does not carry over: MEmoR scenes hold several characters, and AMER attends across them
twice (modality-level inter-personal attention at each time step, and person-level attention
after fusion). A session here has one participant, so both steps would attend over a single
token and are omitted; the intra-personal attention over time is kept. MEmoR reads the output at
one target moment; a window has none, so the attended tokens are averaged over valid frames.
"""
from __future__ import annotations

import torch
from torch import nn

from empathic_fusion.core.registry import register_model
from empathic_fusion.models.components.attention import masked_self_attention
from empathic_fusion.models.components.encoders import feedforward
from empathic_fusion.models.components.pooling import masked_mean

# Frame-encoder widths in units of D_e, as in the original (visual 4-3-2, audio 8-4-2, text 4-2).
WIDTHS = {"video": (4, 3, 2), "audio": (8, 4, 2), "text": (4, 2)}


@register_model("amer", module="fusion", display="AMER", paper_rank=0)
class AMER(nn.Module):
    required_head: str | None = None  # any head of the config (models/contracts.py FusionNet)

    def __init__(self, modalities: list[str], input_dims: dict[str, int], d_e: int = 128):
        super().__init__()
        self.modalities = list(modalities)
        self.encoders = nn.ModuleDict({
            m: feedforward([int(input_dims[m])] + [w * d_e for w in WIDTHS[m]]) for m in self.modalities
        })
        traits = int(input_dims["traits"])
        self.personality = feedforward([2 * traits, 4 * d_e, 2 * d_e])  # traits and their mask
        self.temperature = (4 * d_e) ** 0.5
        self.fusion = nn.Linear(4 * d_e * len(self.modalities), 4 * d_e)
        self.out_dim = 4 * d_e

    def forward(self, batch: dict) -> torch.Tensor:
        present = batch["traits_mask"].to(batch["traits"].dtype)
        person = self.personality(torch.cat([batch["traits"] * present, present], dim=-1))
        # every modality's tokens are 4 * D_e wide: their attention and pooling run as one batch of k * B windows.
        # A masked frame's token is neither a key nor part of the pooled mean, so its features need no masking.
        frames = torch.stack([self.encoders[m](batch[m]["x"]) for m in self.modalities])
        k, windows, steps, width = frames.shape
        tokens = torch.cat([frames, person[None, :, None, :].expand(k, windows, steps, width)], dim=-1).flatten(0, 1)
        mask = torch.stack([batch[m]["mask"] for m in self.modalities]).flatten(0, 1)
        attended = masked_self_attention(tokens, mask, self.temperature) + tokens
        summaries = masked_mean(attended, mask).view(k, windows, -1).transpose(0, 1).reshape(windows, -1)
        return self.fusion(summaries)
