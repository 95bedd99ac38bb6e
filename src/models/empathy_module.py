"""The one LightningModule for every fusion model: net (encoders + fusion) -> Z -> head -> score.

Training recipe defaults follow Appendix B: AdamW lr 1e-4, StepLR every 5 epochs by 0.1, MSE.
Metrics are logged per stage as `{stage}/window/{metric}` and `{stage}/rating/{metric}`.
Parameter-free baselines (`mean`, `story_similarity`) run through the same flow: a net may name
the head it needs (`required_head`), a head may be fitted in closed form at the start of fit
(`fit`, given the training-split mean), and with nothing to train no optimizer step is taken.
"""
from __future__ import annotations

from typing import Any

import hydra
import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import CatMetric

from src.metrics import aggregate_by_rating, empathy_metrics, rating_threshold_to_target
from src.models.components.heads import make_head

STAGES = ("train", "val", "test")


class EmpathyModule(L.LightningModule):
    def __init__(self, net: dict[str, Any], modalities: list[str], input_dims: dict[str, int],
                 head: str = "similarity", optimizer: dict[str, float] | None = None,
                 scheduler: dict[str, float] | None = None, threshold_rating: float = 3.0,
                 data_info: dict[str, Any] | None = None, run_config: dict[str, Any] | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.net = hydra.utils.instantiate(net, modalities=list(modalities), input_dims=dict(input_dims),
                                           _convert_="all")
        required = getattr(self.net, "required_head", head)
        if head != required:
            raise ValueError(f"{type(self.net).__name__} works only with head={required}, got head={head}")
        self.head = make_head(head, self.net.out_dim, int(input_dims["story"]))
        self.optimizer_cfg = {"lr": 1e-4, "weight_decay": 0.01, **(optimizer or {})}
        self.scheduler_cfg = {"step_size": 5, "gamma": 0.1, **(scheduler or {})}
        self.threshold = rating_threshold_to_target(threshold_rating)
        self.collected = torch.nn.ModuleDict({
            f"{stage}_outputs": torch.nn.ModuleDict({k: CatMetric() for k in ("pred", "target", "rating")})
            for stage in STAGES
        })  # "train" itself would clash with nn.Module.train
        self.results: dict[str, dict[str, dict[str, float]]] = {}
        self.test_predictions: dict[str, torch.Tensor] = {}

    def forward(self, batch: dict) -> torch.Tensor:
        """Predicted empathy on the cosine scale, one value per window."""
        return self.head(self.net(batch), batch["story"])

    def _step(self, batch: dict, stage: str) -> torch.Tensor:
        pred = self(batch)
        loss = F.mse_loss(pred, batch["target"])
        self.log(f"{stage}/loss", loss, on_step=stage == "train", on_epoch=True, prog_bar=True,
                 batch_size=len(pred))
        store = self.collected[f"{stage}_outputs"]
        store["pred"].update(pred.detach().float())
        store["target"].update(batch["target"].float())
        store["rating"].update(batch["rating_index"].float())
        return loss

    def on_fit_start(self) -> None:
        fit = getattr(self.head, "fit", None)
        if fit is not None:  # a closed-form head (the constant baseline): set it from the training split
            mean = getattr(getattr(self.trainer, "datamodule", None), "train_target_mean", None)
            if mean is None:
                raise RuntimeError(f"head '{self.hparams.head}' is set from the datamodule's train_target_mean; "
                                   "fit with a datamodule that has it")
            fit(mean)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor | None:
        loss = self._step(batch, "train")
        return loss if loss.requires_grad else None  # None: nothing to train, Lightning skips the step

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._step(batch, "test")

    def _epoch_end(self, stage: str) -> None:
        store = self.collected[f"{stage}_outputs"]
        if store["pred"].update_count == 0:
            return
        pred, target = store["pred"].compute().cpu(), store["target"].compute().cpu()
        rating = store["rating"].compute().cpu().long()
        for metric in store.values():
            metric.reset()
        rating_pred, rating_target, ids = aggregate_by_rating(pred, target, rating)
        levels = {"window": empathy_metrics(pred, target, self.threshold),
                  "rating": empathy_metrics(rating_pred, rating_target, self.threshold)}
        self.results[stage] = levels
        for level, values in levels.items():
            self.log_dict({f"{stage}/{level}/{k}": v for k, v in values.items()}, prog_bar=False)
        if stage == "test":
            self.test_predictions = {"window_pred": pred, "window_target": target, "window_rating": rating,
                                     "rating_pred": rating_pred, "rating_target": rating_target, "rating_index": ids}

    def on_train_epoch_end(self) -> None:
        self._epoch_end("train")

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test")

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:  # parameter-free baseline: Lightning runs the epochs without an optimizer
            return None
        optimizer = torch.optim.AdamW(params, lr=self.optimizer_cfg["lr"],
                                      weight_decay=self.optimizer_cfg["weight_decay"])
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=int(self.scheduler_cfg["step_size"]),
                                                    gamma=self.scheduler_cfg["gamma"])
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}
