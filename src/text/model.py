"""Text regressor (seed 003): encoder -> mean-pooled field embeddings [+ persona] -> MLP -> one
score per label; the overall score is the mean of the label scores (seed 003: Empathy = (C+E+B)/3).

Persona conditioning (seed 000): each categorical attribute gets an embedding, numeric attributes a
linear map; the persona vector is concatenated to the text representation. `use_persona=False`
drops it (same data, same head otherwise), so its effect can be measured.
Targets are standardised with training-fold statistics; MSE is taken on that scale.
"""
from __future__ import annotations

import copy

import lightning as L
import numpy as np
import torch
from torch import nn

from src.text.encoder import TextEncoder

OVERALL = "overall"


class PersonaEmbedding(nn.Module):
    """Categorical ids -> embeddings, numeric z-scores -> linear; concatenated."""

    def __init__(self, cardinalities: list[int], n_numeric: int, dim: int):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(n, dim) for n in cardinalities)
        self.numeric = nn.Linear(n_numeric, dim) if n_numeric else None
        self.out_dim = dim * (len(cardinalities) + (1 if n_numeric else 0))

    def forward(self, ids: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        parts = [emb(ids[:, j]) for j, emb in enumerate(self.embeddings)]
        if self.numeric is not None:
            parts.append(self.numeric(numeric))
        return torch.cat(parts, dim=-1)


class TextRegressor(nn.Module):
    """Shared encoder over every text field, optional persona, MLP head with one output per label.

    With a frozen encoder the net holds no encoder: batches bring the cached field embeddings
    (`embeddings`, fields concatenated), so a training step is only the head. A fine-tuned encoder
    is part of the net and batches bring the raw `texts`.
    """

    def __init__(self, fields: list[str], n_outputs: int, text_dim: int, encoder: TextEncoder | None = None,
                 hidden: int = 256, dropout: float = 0.1, persona_cardinalities: list[int] | None = None,
                 persona_numeric: int = 0, persona_dim: int = 8):
        super().__init__()
        self.encoder = encoder
        self.fields = list(fields)
        cards = persona_cardinalities or []
        self.persona = PersonaEmbedding(cards, persona_numeric, persona_dim) if (cards or persona_numeric) else None
        in_dim = text_dim * len(self.fields) + (self.persona.out_dim if self.persona else 0)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(in_dim, hidden), nn.GELU(), nn.Dropout(dropout),
                                  nn.Linear(hidden, n_outputs))

    def forward(self, batch: dict) -> torch.Tensor:
        if "embeddings" in batch:
            parts = [batch["embeddings"]]
        elif self.encoder is not None:
            parts = [self.encoder(batch["texts"][f]) for f in self.fields]
        else:
            raise ValueError("a net without encoder needs batch['embeddings'] (the frozen encoder's outputs)")
        if self.persona is not None:
            parts.append(self.persona(batch["persona_ids"], batch["persona_numeric"]))
        return self.head(torch.cat(parts, dim=-1))


class TextRegressorModule(L.LightningModule):
    """Training, validation and test of a TextRegressor; keeps the best validation weights in memory."""

    def __init__(self, net: TextRegressor, label_names: list[str], target_mean: np.ndarray, target_std: np.ndarray,
                 levels: tuple[int, int] | None, lr: float = 1e-3, encoder_lr: float = 2e-5, weight_decay: float = 0.01):
        super().__init__()
        self.net = net
        self.label_names = list(label_names)
        self.register_buffer("target_mean", torch.as_tensor(np.asarray(target_mean), dtype=torch.float32))
        self.register_buffer("target_std", torch.as_tensor(np.asarray(target_std), dtype=torch.float32))
        self.levels = levels
        self.lr, self.encoder_lr, self.weight_decay = lr, encoder_lr, weight_decay
        self.best_val = float("inf")
        self.best_state: dict | None = None
        self._outputs: dict[str, list] = {"val": [], "test": []}

    def predict_scores(self, batch: dict) -> torch.Tensor:
        """Scores on the label scale, N x n_labels."""
        return self.net(batch) * self.target_std + self.target_mean

    def _loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.net(batch)
        loss = nn.functional.mse_loss(z, (batch["target"] - self.target_mean) / self.target_std)
        return loss, z * self.target_std + self.target_mean

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _ = self._loss(batch)
        self.log("train/loss", loss, batch_size=len(batch["target"]), prog_bar=True)
        return loss

    def _eval_step(self, split: str, batch: dict) -> None:
        loss, scores = self._loss(batch)
        self.log(f"{split}/loss", loss, batch_size=len(batch["target"]), prog_bar=split == "val")
        self._outputs[split].append((scores.detach().cpu(), batch["target"].detach().cpu(), batch["row"].cpu()))

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._eval_step("test", batch)

    def on_validation_epoch_end(self) -> None:
        if not self._outputs["val"] or self.trainer.sanity_checking:
            self._outputs["val"].clear()
            return
        pred, target, _ = self.collect("val")
        loss = float(np.mean(((pred - target) / self.target_std.cpu().numpy()) ** 2))
        if loss < self.best_val:
            self.best_val = loss
            self.best_state = {k: v.detach().clone() for k, v in self.trainable_state().items()}

    def collect(self, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(predictions, targets, row indices) gathered over the split's batches, then cleared."""
        outs = self._outputs[split]
        self._outputs[split] = []
        return (torch.cat([o[0] for o in outs]).numpy(), torch.cat([o[1] for o in outs]).numpy(),
                torch.cat([o[2] for o in outs]).numpy())

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The weights that training changes (a frozen encoder is not part of the net)."""
        return dict(self.state_dict())

    def restore_best(self) -> None:
        if self.best_state is not None:
            self.load_state_dict(copy.deepcopy(self.best_state), strict=False)

    def configure_optimizers(self):
        encoder = self.net.encoder
        encoder_params = [p for p in encoder.parameters() if p.requires_grad] if encoder is not None else []
        other = [p for n, p in self.net.named_parameters() if p.requires_grad and not n.startswith("encoder.")]
        groups = [{"params": other, "lr": self.lr}]
        if encoder_params:
            groups.append({"params": encoder_params, "lr": self.encoder_lr})
        return torch.optim.AdamW(groups, weight_decay=self.weight_decay)
