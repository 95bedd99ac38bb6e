"""Heads turning a multimodal representation Z into an empathy score on the cosine scale [-1, 1].

similarity: the paper's sim(Z, E(story)) = cos(W Z, E(story)); ratings 1..5 map to (r - 3) / 2.
regression: an MLP on [Z, E(story)] predicting the same scale directly (unbounded).
Parameter-free heads for the baselines (no gradient step):
cosine: cos(Z, E(story)) without a projection (Z must live in the story embedding's space).
constant: one value for every window, set by `fit` (the training mean).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from empathic_fusion.config.model import FUSION_HEADS as HEADS  # the model schema's list of heads
from empathic_fusion.models.components.encoders import mlp


class SimilarityHead(nn.Module):
    def __init__(self, representation_dim: int, story_dim: int):
        super().__init__()
        self.project = nn.Linear(representation_dim, story_dim)

    def forward(self, z: torch.Tensor, story: torch.Tensor) -> torch.Tensor:
        return F.cosine_similarity(self.project(z), story, dim=-1, eps=1e-6)


class RegressionHead(nn.Module):
    def __init__(self, representation_dim: int, story_dim: int, hidden: int = 64, dropout: float = 0.1):
        super().__init__()
        self.net = mlp(representation_dim + story_dim, hidden, 1, dropout)

    def forward(self, z: torch.Tensor, story: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, story], dim=-1)).squeeze(-1)


class CosineHead(nn.Module):
    def __init__(self, representation_dim: int, story_dim: int):
        super().__init__()
        if representation_dim != story_dim:
            raise ValueError(f"the cosine head compares Z with the story embedding directly: Z has {representation_dim} "
                             f"dimensions, the story {story_dim}")

    def forward(self, z: torch.Tensor, story: torch.Tensor) -> torch.Tensor:
        return F.cosine_similarity(z, story, dim=-1, eps=1e-6)


class ConstantHead(nn.Module):
    def __init__(self, representation_dim: int, story_dim: int):
        super().__init__()
        self.register_buffer("value", torch.zeros(()))  # a buffer: saved in checkpoints, never trained

    def fit(self, value: float) -> None:
        self.value.fill_(float(value))

    def forward(self, z: torch.Tensor, story: torch.Tensor) -> torch.Tensor:
        return self.value.expand(story.shape[0]).to(story.dtype)


def make_head(kind: str, representation_dim: int, story_dim: int) -> nn.Module:
    if kind == "cosine":
        return CosineHead(representation_dim, story_dim)
    if kind == "constant":
        return ConstantHead(representation_dim, story_dim)
    if kind == "similarity":
        return SimilarityHead(representation_dim, story_dim)
    if kind == "regression":
        return RegressionHead(representation_dim, story_dim)
    raise ValueError(f"head must be one of {HEADS}, got '{kind}'")
