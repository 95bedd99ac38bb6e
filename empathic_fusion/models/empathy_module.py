"""The one LightningModule for every fusion model: net (encoders + fusion) -> Z -> head -> score.

Training recipe defaults follow Appendix B of Shen, Kim et al. 2024 (EmpathicStories++): AdamW lr
1e-4, StepLR every 5 epochs by 0.1 (conf/optimizer/adamw.yaml, conf/scheduler/step_lr.yaml), MSE.
Metrics are logged per stage as `{stage}/window/{metric}` and `{stage}/rating/{metric}`.
Parameter-free baselines (`mean`, `story_similarity`) run through the same flow: a net may name
the head it needs (`required_head`), a head may be fitted in closed form at the start of fit
(`fit`, given the training-split mean), and with nothing to train no optimizer step is taken.

Checkpoints describe themselves (`checkpoint["empathic_fusion"]`, see `describe_checkpoint`): the
modality set, the input dims per modality, the feature config and the feature-store manifest hash.
Running a model on features with other dims stops with a message saying which and how to fix it,
instead of a shape error deep inside an encoder.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
import torch.nn.functional as F
import yaml
from torchmetrics import CatMetric

from empathic_fusion.metrics import aggregate_by_rating, empathy_metrics, rating_threshold_to_target
from empathic_fusion.models.components.heads import make_head
from empathic_fusion.utils import CONFIG_DIR

STAGES = ("train", "val", "test")
OPTIMIZER_DEFAULTS: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "optimizer" / "adamw.yaml").read_text())
SCHEDULER_DEFAULTS: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "scheduler" / "step_lr.yaml").read_text())
CHECKPOINT_KEY = "empathic_fusion"
CHECKPOINT_FORMAT = 1
STATS_KEY = "empathic_fusion_normalization"  # training-split mean/std per modality, to score new clips


class FeatureMismatchError(ValueError):
    """The data's features do not have the dims (or modalities) a checkpoint was trained on."""


def _mismatch_message(description: dict[str, Any], problems: list[str]) -> str:
    features = description.get("features")
    return ("the model was trained on other features than these: " + "; ".join(problems)
            + f". It expects modalities {description.get('modalities')} with dims {description.get('input_dims')}"
            + (f" (feature config {features})" if features else "")
            + ". Extract the features with the checkpoint's feature config (evaluate.py does so unless "
              "features.* are overridden) or retrain on these features.")


def describe_checkpoint(path: str | Path) -> dict[str, Any]:
    """What a checkpoint was trained on: modalities, input dims, feature config, data hashes."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if CHECKPOINT_KEY in checkpoint:
        return checkpoint[CHECKPOINT_KEY]
    hparams = checkpoint.get("hyper_parameters")
    if not hparams:
        raise ValueError(f"{path} is not an empathic-fusion checkpoint (no hyper_parameters)")
    return _description(hparams)


def _description(hparams: Any) -> dict[str, Any]:
    data_info = hparams.get("data_info") or {}
    run_config = hparams.get("run_config") or {}
    return {"format": CHECKPOINT_FORMAT, "modalities": list(hparams["modalities"]),
            "input_dims": {k: int(v) for k, v in dict(hparams["input_dims"]).items()},
            "features": run_config.get("features"), "feature_manifest_hash": data_info.get("feature_manifest_hash"),
            "split_hash": data_info.get("split_hash"), "window_frames": data_info.get("window_frames"),
            "dataset": data_info.get("dataset"), "net": dict(hparams["net"]).get("_target_"), "head": hparams["head"]}


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
        # the defaults are conf/optimizer/adamw.yaml and conf/scheduler/step_lr.yaml (a checkpoint or
        # caller giving only {"lr": ...} gets the rest from there)
        self.optimizer_cfg = {**OPTIMIZER_DEFAULTS, **(optimizer or {})}
        self.scheduler_cfg = {**SCHEDULER_DEFAULTS, **(scheduler or {})}
        self.threshold = rating_threshold_to_target(threshold_rating)
        self.collected = torch.nn.ModuleDict({
            f"{stage}_outputs": torch.nn.ModuleDict({k: CatMetric(nan_strategy="disable") for k in ("pred", "target", "rating")})
            for stage in STAGES
        })  # "train" itself would clash with nn.Module.train
        self.results: dict[str, dict[str, dict[str, float]]] = {}
        self.test_predictions: dict[str, torch.Tensor] = {}
        self.normalization: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def describe(self) -> dict[str, Any]:
        """The self-description stored in every checkpoint."""
        return _description(self.hparams)

    def check_input_dims(self, input_dims: dict[str, int], modalities: list[str] | None = None) -> None:
        """Raise FeatureMismatchError when data of these dims (and modalities) cannot feed this model."""
        expected = self.hparams.input_dims
        problems = []
        if modalities is not None and set(modalities) != set(self.hparams.modalities):
            problems.append(f"modalities {sorted(modalities)} instead of {sorted(self.hparams.modalities)}")
        for name in [*self.hparams.modalities, "story"]:
            if name in input_dims and int(input_dims[name]) != int(expected[name]):
                problems.append(f"{name} has {int(input_dims[name])} dims instead of {int(expected[name])}")
        if problems:
            raise FeatureMismatchError(_mismatch_message(self.describe(), problems))

    def _check_batch(self, batch: dict) -> None:
        dims = {m: batch[m]["x"].shape[-1] for m in self.hparams.modalities if isinstance(batch.get(m), dict)}
        if "story" in batch:
            dims["story"] = batch["story"].shape[-1]
        self.check_input_dims(dims)

    def forward(self, batch: dict) -> torch.Tensor:
        """Predicted empathy on the cosine scale, one value per window."""
        self._check_batch(batch)
        return self.head(self.net(batch), batch["story"])

    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        input_dims = getattr(datamodule, "input_dims", None)
        if input_dims:  # fail before the first batch when the datamodule already knows its dims
            self.check_input_dims(input_dims, getattr(datamodule, "modalities", None))
        stats = getattr(datamodule, "stats", None)
        if stats:  # kept with the weights: a new clip (serve.py) is z-scored like the training split
            self.normalization = {m: (torch.as_tensor(mean), torch.as_tensor(std)) for m, (mean, std) in stats.items()}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[CHECKPOINT_KEY] = self.describe()
        if self.normalization:
            checkpoint[STATS_KEY] = self.normalization

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.normalization = dict(checkpoint.get(STATS_KEY) or {})

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

    def predict_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """Predicted empathy per window on the cosine scale (a datamodule's predict split, in order)."""
        return self(batch)

    def _epoch_end(self, stage: str) -> None:
        store = self.collected[f"{stage}_outputs"]
        if store["pred"].update_count == 0:
            return
        pred, target = store["pred"].compute().cpu(), store["target"].compute().cpu()
        rating = store["rating"].compute().cpu().long()
        for metric in store.values():
            metric.reset()
        if not torch.isfinite(pred).all():  # NaN kept (nan_strategy="disable"): say so instead of failing later
            bad = int((~torch.isfinite(pred)).sum())
            raise FloatingPointError(f"{stage}: {bad} of {len(pred)} window predictions are NaN/Inf. The inputs or "
                                     "the weights hold non-finite values: run `python extract.py verify=true` to "
                                     "check the feature store, or lower the learning rate")
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
        optimizer = hydra.utils.instantiate(self.optimizer_cfg)(params)
        scheduler_cfg = dict(self.scheduler_cfg)
        interval = scheduler_cfg.pop("interval", "epoch")
        scheduler = hydra.utils.instantiate(scheduler_cfg)(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}
