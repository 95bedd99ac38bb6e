"""Modules fitted once on the training rows (not by gradient descent) whose fitted state travels in
the checkpoint as PyTorch extra state: the text branches (empathic_fusion/models/text/branches.py) and the ridge
experts (empathic_fusion/models/text/experts.py)."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


class FittedModule(nn.Module):
    """Holds `_state` (None until fitted), saved and restored with the state dict."""

    def __init__(self):
        super().__init__()
        self._state: dict[str, Any] | None = None

    @property
    def fitted(self) -> bool:
        return self._state is not None

    @staticmethod
    def _as_batch_tensor(values: np.ndarray, batch: dict) -> torch.Tensor:
        """A float32 array as a tensor on the batch's device."""
        device = batch["persona_ids"].device if "persona_ids" in batch else None
        return torch.from_numpy(np.asarray(values, dtype=np.float32)).to(device)

    def get_extra_state(self) -> dict[str, Any] | None:
        return self._state

    def set_extra_state(self, state: dict[str, Any] | None) -> None:
        self._state = state
