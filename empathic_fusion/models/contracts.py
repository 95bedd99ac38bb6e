"""What the LightningModules ask of the parts a model config builds, declared once: a fusion net and its head
(models/fusion_module.py), and a text expert and branch stacked by the text model (models/text_module.py).

A part of one's own implements these (no base class needed); the modules check a net, an expert and a branch
against them when they are built (`check_part`), so a part that lacks a member fails there, the member named.
"""
from __future__ import annotations

from typing import Any, Generic, Protocol, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class FusionNet(Protocol):
    """A fusion model's net (conf/model/<name>.yaml `net`): modality encoders and their fusion into one
    representation Z per window, which the head turns into a prediction."""

    modalities: list[str]       # the modalities it reads from a batch
    out_dim: int                # the width of Z
    required_head: str | None   # the one head it works with ("cosine", "constant"); None: the config's `head`

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Z for a batch in the datamodule's batch contract."""


@runtime_checkable
class FusionHead(Protocol):
    """Z and the read story's embedding to a prediction (models/components/heads.py `make_head`)."""

    closed_form: bool  # set once from the training split at the start of fit, never trained (ClosedFormHead)

    def forward(self, z: torch.Tensor, story: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class ClosedFormHead(FusionHead, Protocol):
    """A head set from the training windows' mean target (the `mean` baseline's constant head)."""

    def fit(self, value: float) -> None: ...


@runtime_checkable
class TextExpert(Protocol):
    """One expert of the text model's stack: fitted on the training rows with held-out (cross-fitted) scores,
    which the stack weighs; then it scores any batch."""

    label: str                      # its name in the stack report and on the model card
    needs_embeddings: bool          # it reads the frozen encoder's layers (so the encoder must stay frozen)
    layer_sets: tuple[int, ...]     # the encoder layer sets it reads from batch["layer_embeddings"] (may be empty)
    alpha: float | None             # its chosen ridge penalty (None: not a ridge)
    grid_end: str | None            # "lower" or "upper" when that penalty sits at an end of its widened grid

    def expand(self, fields: list[str], dim: int, encoder_layers: int | None = None) -> list[TextExpert]:
        """The experts this config entry stands for (one per field, layer set, ...)."""

    def fit(self, batch: dict, targets: np.ndarray, groups: list[str] | np.ndarray) -> np.ndarray:
        """Fit on the training rows; return their held-out scores (rows x labels)."""

    def forward(self, batch: dict) -> torch.Tensor: ...


@runtime_checkable
class TextBranch(Protocol):
    """Extra features computed from the texts (TF-IDF, ...), fitted once on the training rows."""

    out_dim: int
    fitted: bool

    def fit(self, texts: dict[str, list[str]]) -> Any: ...

    def forward(self, batch: dict) -> torch.Tensor: ...


def members(contract: type) -> list[str]:
    """The attributes and methods a Protocol above declares (its bases' too)."""
    names: list[str] = []
    for cls in reversed(contract.__mro__):
        if cls not in (object, Generic, Protocol):
            names += list(cls.__dict__.get("__annotations__", {}))
            names += [n for n, v in cls.__dict__.items() if callable(v) and not n.startswith("_")]
    return list(dict.fromkeys(names))


def check_part(part: object, contract: type, hint: str = "") -> None:
    """Raise TypeError naming the members of `contract` that `part` lacks."""
    if not isinstance(part, contract):
        lacking = [name for name in members(contract) if not hasattr(part, name)]
        raise TypeError(f"{type(part).__name__} is not a {contract.__name__}: it lacks {lacking} "
                        f"(empathic_fusion/models/contracts.py){hint}")
