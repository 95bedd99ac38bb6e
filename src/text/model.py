"""Text regressor (Haleas, "Exploring the Empathy of Leading Large Language Models"): encoder -> pooled field embeddings [+ persona] -> MLP ->
one score per label; the overall score is the mean of the label scores (Empathy = (C+E+B)/3).

`TextEmpathyModule` is the LightningModule every text model trains as, built from config like the
fusion nets: `net` (a `_target_`, with its `encoder` a `_target_` too: frozen and cached, or the
top n layers fine-tuned; pooling is the encoder's; `head` a `_partial_`; an optional extra
`branch`, src/text/branches.py), `optimizer` and `scheduler` (`_partial_`
configs, conf/optimizer, conf/scheduler). Persona conditioning ("Talk, Listen, Connect"): each
categorical attribute gets an embedding, numeric attributes a linear map, concatenated to the text
representation; `use_persona=False` drops it. Targets are standardised with the training fold's
statistics (kept in the checkpoint); MSE is taken on that scale.

Checkpoints describe themselves: `hyper_parameters` hold the net/optimizer configs and `data_info`
(fields, labels, persona vocabulary, target scaling, levels); `checkpoint["empathic_text"]` adds
the encoder's folder and identity hash, checked when the checkpoint is loaded.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hydra
import lightning as L
import numpy as np
import torch
from torch import nn

from src.metrics import metric_values
from src.text.data import PersonaEncoder
from src.text.encoder import TextEncoder

OVERALL = "overall"
CHECKPOINT_KEY = "empathic_text"


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


class MLPHead(nn.Sequential):
    """Dropout -> Linear -> GELU -> Dropout -> Linear: one output per label."""

    def __init__(self, in_dim: int, n_outputs: int, hidden: int = 256, dropout: float = 0.1):
        super().__init__(nn.Dropout(dropout), nn.Linear(in_dim, hidden), nn.GELU(), nn.Dropout(dropout),
                         nn.Linear(hidden, n_outputs))


class TextRegressor(nn.Module):
    """Shared encoder over every text field, optional persona, MLP head with one output per label.

    With a frozen encoder the net holds no encoder (its weights stay out of checkpoints): batches
    bring the cached field embeddings (`embeddings`, fields concatenated), so a step is only the
    head. A fine-tuned encoder is part of the net and reads the batch's raw `texts`.
    `head` builds the head from (input dim, outputs) (a `_partial_` config; default MLPHead); an
    optional `branch` (src/text/branches.py, e.g. TF-IDF) adds features computed from the texts.
    """

    def __init__(self, fields: list[str], n_outputs: int, encoder: TextEncoder,
                 head: Callable[[int, int], nn.Module] | None = None, branch: nn.Module | None = None,
                 persona_cardinalities: list[int] | None = None, persona_numeric: int = 0, persona_dim: int = 8):
        super().__init__()
        self.encoder = None if encoder.frozen else encoder
        self.fields = list(fields)
        cards = persona_cardinalities or []
        self.persona = PersonaEmbedding(cards, persona_numeric, persona_dim) if (cards or persona_numeric) else None
        self.branch = branch
        in_dim = encoder.dim * len(self.fields) + (self.persona.out_dim if self.persona else 0) \
            + (branch.out_dim if branch is not None else 0)
        self.head = (head or MLPHead)(in_dim, n_outputs)

    def forward(self, batch: dict) -> torch.Tensor:
        if self.encoder is not None:
            parts = [self.encoder(batch["texts"][f]) for f in self.fields]
        elif "embeddings" in batch:
            parts = [batch["embeddings"]]
        else:
            raise ValueError("a net over a frozen encoder needs batch['embeddings'] (attach the encoder to the "
                             "datamodule: datamodule.embedder = module.frozen_encoder)")
        if self.branch is not None:
            parts.append(self.branch(batch).to(parts[0].dtype))
        if self.persona is not None:
            parts.append(self.persona(batch["persona_ids"], batch["persona_numeric"]))
        return self.head(torch.cat(parts, dim=-1))


class TextEmpathyModule(L.LightningModule):
    """Train / validate / test / predict a text net; logs `{stage}/loss` and `{stage}/rating/{r,rho,mse}`
    of the overall score (the mean of the labels) so sweepers can optimise a validation metric."""

    def __init__(self, net: dict[str, Any], data_info: dict[str, Any], optimizer: dict[str, Any],
                 scheduler: dict[str, Any] | None = None, encoder_lr: float = 2.0e-5, use_persona: bool = True,
                 run_config: dict[str, Any] | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.label_names = list(data_info["labels"])
        self.levels = tuple(data_info["levels"]) if data_info.get("levels") else None
        self.persona_encoder = PersonaEncoder.from_state(data_info["persona"])
        persona = use_persona and bool(self.persona_encoder.columns)
        net_cfg = dict(net)
        encoder: TextEncoder = hydra.utils.instantiate(net_cfg.pop("encoder"))
        self.net: TextRegressor = hydra.utils.instantiate(
            net_cfg, fields=list(data_info["fields"]), n_outputs=len(self.label_names), encoder=encoder,
            persona_cardinalities=self.persona_encoder.cardinalities if persona else None,
            persona_numeric=self.persona_encoder.n_numeric if persona else 0)
        self.__dict__["frozen_encoder"] = encoder if encoder.frozen else None  # not a submodule: no weights saved
        self.encoder_info = {"model_path": encoder.model_path, "identity": encoder.identity,
                             "trainable_layers": encoder.trainable_layers}
        self.register_buffer("target_mean", torch.tensor(data_info["target_mean"], dtype=torch.float32))
        self.register_buffer("target_std", torch.tensor(data_info["target_std"], dtype=torch.float32))
        self._outputs: dict[str, list] = {"val": [], "test": []}
        self.test_predictions: dict[str, np.ndarray] = {}

    @property
    def encoder(self) -> TextEncoder:
        return self.frozen_encoder if self.frozen_encoder is not None else self.net.encoder

    def forward(self, batch: dict) -> torch.Tensor:
        """Scores on the label scale, N x labels."""
        return self.net(batch) * self.target_std + self.target_mean

    def on_fit_start(self) -> None:
        """Fit an extra branch (TF-IDF, ...) on the training rows' texts, once (not again on resume)."""
        branch = self.net.branch
        if branch is not None and not getattr(branch, "fitted", True):
            dm = self.trainer.datamodule
            branch.fit({f: [dm.fields[f][i] for i in dm.train_rows] for f in self.net.fields})

    def _step(self, batch: dict, stage: str) -> torch.Tensor:
        z = self.net(batch)
        loss = nn.functional.mse_loss(z, (batch["target"] - self.target_mean) / self.target_std)
        self.log(f"{stage}/loss", loss, batch_size=len(batch["target"]), prog_bar=stage != "test",
                 sync_dist=stage != "train")
        if stage in self._outputs:
            scores = z.detach() * self.target_std + self.target_mean
            self._outputs[stage].append((scores.float().cpu(), batch["target"].cpu(), batch["row"].cpu()))
        return loss

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "test")

    def predict_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self(batch)

    def _gather(self, stage: str) -> dict[str, np.ndarray]:
        outs, self._outputs[stage] = self._outputs[stage], []
        if not outs:
            return {}
        pred, target, row = (torch.cat([o[i] for o in outs]) for i in range(3))
        if self.trainer.world_size > 1:  # DDP: every process gets every rank's rows
            pred, target, row = (self.all_gather(t).flatten(0, 1) if t.dim() > 1 else self.all_gather(t).flatten()
                                 for t in (pred, target, row))
            order = np.unique(row.cpu().numpy(), return_index=True)[1]
            pred, target, row = pred[order], target[order], row[order]
        return {"pred": pred.cpu().numpy(), "target": target.cpu().numpy(), "row": row.cpu().numpy()}

    def _epoch_metrics(self, stage: str) -> dict[str, np.ndarray]:
        gathered = self._gather(stage)
        if gathered and not self.trainer.sanity_checking:
            values = metric_values(gathered["pred"].mean(1), gathered["target"].mean(1))
            for name in ("pearson", "spearman", "mse"):
                self.log(f"{stage}/rating/{name}", float(values[name]), sync_dist=False)
        return gathered

    def on_validation_epoch_end(self) -> None:
        self._epoch_metrics("val")

    def on_test_epoch_end(self) -> None:
        self.test_predictions = self._epoch_metrics("test")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = {"format": 1, "encoder": self.encoder_info, "fields": list(self.net.fields),
                                      "labels": self.label_names}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = (checkpoint.get(CHECKPOINT_KEY) or {}).get("encoder") or {}
        if saved.get("identity") and saved["identity"] != self.encoder_info["identity"]:
            raise ValueError(f"the checkpoint was trained with encoder {saved.get('model_path')} (identity "
                             f"{saved['identity']}), but {self.encoder_info['model_path']} (identity "
                             f"{self.encoder_info['identity']}) was loaded: give model.net.encoder.model_path of "
                             "the training encoder")

    def configure_optimizers(self):
        encoder = self.net.encoder
        encoder_params = [p for p in encoder.parameters() if p.requires_grad] if encoder is not None else []
        other = [p for n, p in self.net.named_parameters() if p.requires_grad and not n.startswith("encoder.")]
        groups = [{"params": other}]
        if encoder_params:
            groups.append({"params": encoder_params, "lr": self.hparams.encoder_lr})
        optimizer = hydra.utils.instantiate(self.hparams.optimizer)(groups)
        if not self.hparams.scheduler:
            return optimizer
        scheduler_cfg = dict(self.hparams.scheduler)
        interval = scheduler_cfg.pop("interval", "epoch")
        scheduler = hydra.utils.instantiate(scheduler_cfg)(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}
