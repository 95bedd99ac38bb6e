"""`mean` baseline: predicts the training split's mean rating whatever the input.

It runs through the same LightningModule as the fusion models: this net ignores its inputs and
returns a one-dimensional zero Z that nothing reads, and the `constant` head holds the value, set
from the datamodule's training-split mean at the start of fit (no gradient step). Its test rows therefore equal the
"constant train mean" rows the report prints next to every model.
"""
from __future__ import annotations

import torch
from torch import nn

from empathic_fusion.core.registry import register_model


@register_model("mean", module="fusion", display="Train mean", paper_rank=5)
class MeanBaseline(nn.Module):
    required_head = "constant"

    def __init__(self, modalities: list[str], input_dims: dict[str, int]):
        super().__init__()
        self.modalities = list(modalities)
        self.out_dim = 1

    def forward(self, batch: dict) -> torch.Tensor:
        story = batch["story"]
        return story.new_zeros(story.shape[0], 1)
