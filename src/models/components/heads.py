"""Heads turning a multimodal representation Z into an empathy score on the cosine scale [-1, 1].

similarity: the paper's sim(Z, E(story)) = cos(W Z, E(story)); ratings 1..5 map to (r - 3) / 2.
regression: an MLP on [Z, E(story)] predicting the same scale directly (unbounded).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from src.models.components.encoders import mlp

HEADS = ("similarity", "regression")


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


def make_head(kind: str, representation_dim: int, story_dim: int) -> nn.Module:
    if kind == "similarity":
        return SimilarityHead(representation_dim, story_dim)
    if kind == "regression":
        return RegressionHead(representation_dim, story_dim)
    raise ValueError(f"head must be one of {HEADS}, got '{kind}'")
