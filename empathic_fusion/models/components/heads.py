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


class _CosineToFixed(torch.autograd.Function):
    """cos(p, s) per row for a `p` that trains and an `s` that does not (the story's embedding): the forward
    is F.cosine_similarity's arithmetic (each vector divided by its norm, clamped at `eps`, then the sum of
    their product), the backward one expression, (s_unit - cos * p_unit) * grad / |p|, where autograd's
    walk back through the norms and divisions launches five times as many kernels."""

    @staticmethod
    def forward(ctx, p: torch.Tensor, s: torch.Tensor, eps: float) -> torch.Tensor:
        p_norm = torch.linalg.vector_norm(p, dim=-1, keepdim=True).clamp_min(eps)
        p_unit = p / p_norm
        s_unit = s / torch.linalg.vector_norm(s, dim=-1, keepdim=True).clamp_min(eps)
        cos = (p_unit * s_unit).sum(dim=-1)
        ctx.save_for_backward(p_unit, s_unit, p_norm, cos)
        return cos

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        p_unit, s_unit, p_norm, cos = ctx.saved_tensors
        along = torch.addcmul(s_unit, p_unit, cos.unsqueeze(-1), value=-1.0)
        return along * (grad.unsqueeze(-1) / p_norm), None, None


def cosine_to_fixed(p: torch.Tensor, s: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """F.cosine_similarity(p, s, dim=-1, eps=eps) with a backward of three kernels when only `p` needs a
    gradient; F.cosine_similarity itself otherwise (`s` trains too, or shapes that broadcast)."""
    if s.requires_grad or p.shape != s.shape:
        return F.cosine_similarity(p, s, dim=-1, eps=eps)
    return _CosineToFixed.apply(p, s, eps)


class SimilarityHead(nn.Module):
    closed_form = False  # models/contracts.py FusionHead

    def __init__(self, representation_dim: int, story_dim: int):
        super().__init__()
        self.project = nn.Linear(representation_dim, story_dim)

    def forward(self, z: torch.Tensor, story: torch.Tensor) -> torch.Tensor:
        return cosine_to_fixed(self.project(z), story)


class RegressionHead(nn.Module):
    closed_form = False  # models/contracts.py FusionHead

    def __init__(self, representation_dim: int, story_dim: int, hidden: int = 64, dropout: float = 0.1):
        super().__init__()
        self.net = mlp(representation_dim + story_dim, hidden, 1, dropout)

    def forward(self, z: torch.Tensor, story: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, story], dim=-1)).squeeze(-1)


class CosineHead(nn.Module):
    closed_form = False  # models/contracts.py FusionHead

    def __init__(self, representation_dim: int, story_dim: int):
        super().__init__()
        if representation_dim != story_dim:
            raise ValueError(f"the cosine head compares Z with the story embedding directly: Z has {representation_dim} "
                             f"dimensions, the story {story_dim}")

    def forward(self, z: torch.Tensor, story: torch.Tensor) -> torch.Tensor:
        return F.cosine_similarity(z, story, dim=-1, eps=1e-6)


class ConstantHead(nn.Module):
    closed_form = True  # models/contracts.py FusionHead

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
