"""The base of every model's LightningModule: fusion nets (models/fusion_module.py) and text models
(models/text_module.py) train, test and save through it, so the pipeline has one path for all.

Every module is built the same way (`empathic_fusion.pipeline.train`):
`hydra.utils.instantiate(cfg.model, data_info=datamodule.fitted_state(), run_config=..., _recursive_=False)`,
where `cfg.model._target_` names the module class and `net._target_` the network inside. The base
owns
- the optimizer and scheduler, built from the `_partial_` configs of conf/optimizer and
  conf/scheduler (the composed model config holds them; no defaults live in code),
- the collection of per-stage outputs (`collect`: plain lists of device tensors, concatenated and
  gathered across processes once per epoch),
- the training loss without a host sync per step (`log_training_loss`),
- a self-describing checkpoint header, `checkpoint["empathic_fusion"]` (`HEADER_KEY`): the module's
  and its net's registered names (`module`, `model`; empathic_fusion/core/registry.py, so
  models/checkpoints.py rebuilds any checkpoint, and moving a class does not break it), its format,
  when and from which commit it was written, the datamodule's `describe()` ("data") and the
  subclass's `describe()`,
- `predict_step`.
Modules learn and log; the test report is evaluation's (empathic_fusion/evaluation/report.py), which the
pipeline calls after testing with the module and its datamodule.
"""
from __future__ import annotations

import warnings
from datetime import datetime, timezone
from typing import Any

import hydra
import lightning as L
import torch
from torchmetrics.utilities.distributed import gather_all_tensors

from empathic_fusion.core.registry import registered_name
from empathic_fusion.datamodules.build import build_datamodule, set_up
from empathic_fusion.datamodules.protocol import EmpathyData
from empathic_fusion.utils.loggers import git_commit

# The module's transfer_batch_to_device below is meant to serve every datamodule (ours keep the default hook);
# Lightning says so on every run that passes a datamodule, which only alarms users. Filtered when a module is
# made (not at import: a caller's warnings.catch_warnings, as pytest's around collection, would drop it).
TRANSFER_NOTE = (r"You have overridden `transfer_batch_to_device` in `LightningModule` but have passed in a "
                 r"`LightningDataModule`")

STAGES = ("train", "val", "test")
HEADER_KEY = "empathic_fusion"
HEADER_FORMAT = 3  # 3: registered names (module, model); 2: a dotted class path (class, net)


def build_module(model_cfg: dict[str, Any], data_info: dict[str, Any],
                 run_config: dict[str, Any]) -> "EmpathyLightningModule":
    """The LightningModule a model config names (`_target_`), for data described by `data_info`."""
    return hydra.utils.instantiate(model_cfg, data_info=data_info, run_config=run_config, _recursive_=False,
                                   _convert_="all")


class EmpathyLightningModule(L.LightningModule):
    """Shared training and checkpoint plumbing; subclasses define the net, the step, `describe()` and
    `epoch_end()`.

    `collected_keys` names the tensors a subclass collects per stage with `collect` (read back,
    gathered and reset, by `collected_outputs`)."""

    collected_keys: tuple[str, ...] = ()
    registered_name: str  # set by @register_model: what a checkpoint header calls the module ("fusion", "text")

    def __init__(self, optimizer: dict[str, Any], scheduler: dict[str, Any] | None, data_info: dict[str, Any],
                 run_config: dict[str, Any]):
        super().__init__()
        warnings.filterwarnings("ignore", message=TRANSFER_NOTE, category=UserWarning)  # one entry however many modules
        self.optimizer_cfg = dict(optimizer)
        self.scheduler_cfg = dict(scheduler) if scheduler else None
        self.data_info = dict(data_info)
        self.run_config = dict(run_config)
        self.collected: dict[str, dict[str, list[torch.Tensor]]] = {
            stage: {k: [] for k in self.collected_keys} for stage in STAGES}
        self.__dict__["_loss_sums"] = None  # training loss x windows since the last log and in the epoch (device)
        self._loss_counts = [0, 0]  # windows in those sums
        self.results: dict[str, Any] = {}
        self.test_predictions: dict[str, Any] = {}
        self.data_description: dict[str, Any] = {}  # the datamodule's describe(), kept in the header
        self._commit: str | None = None

    # ---- what the subclasses define ---------------------------------------------------------
    @property
    def title(self) -> str:
        """The model's name in reports: its net's class."""
        return str(self.hparams.net["_target_"]).rsplit(".", 1)[-1]

    @property
    def kind(self) -> str:
        """What this module is ("fusion", "text"): its registered name, so callers ask instead of probing."""
        return self.registered_name

    def describe(self) -> dict[str, Any]:
        """Model-specific fields of the checkpoint header."""
        return {}

    def epoch_end(self, stage: str, outputs: dict[str, torch.Tensor]) -> None:
        """Metrics of one stage's collected outputs (called once per epoch, only when there are some)."""

    def group_attributes(self, datamodule: L.LightningDataModule) -> tuple[list[str], str]:
        """The attributes `evaluation.groups` may name for this model's data, and where they come from."""
        return [], f"{type(self).__name__}'s data"

    def evaluation_datamodule(self, data_overrides: dict[str, Any], features_overrides: dict[str, Any],
                              split: str, test_csv: str | None = None,
                              trainer: L.Trainer | None = None) -> EmpathyData:
        """The datamodule of the run this checkpoint was trained in (data.* / features.* overrides
        applied), set up so that its test split is `split` (test or val), for `trainer`'s device."""
        if test_csv:
            raise ValueError(f"test_csv= scores a text table with a text checkpoint; this checkpoint is a "
                             f"{type(self).__name__}: use data.* overrides instead")
        datamodule = self.instantiate_datamodule({**self.run_config["data"], **data_overrides},
                                                 {**self.run_config["features"], **features_overrides})
        set_up(datamodule, trainer, "test")
        return datamodule

    def instantiate_datamodule(self, data_cfg: dict[str, Any], features_cfg: dict[str, Any]) -> EmpathyData:
        """A datamodule from a data config, with this run's modalities and feature config (as train does)."""
        return build_datamodule(data_cfg, features_cfg, self.run_config["modality"]["names"])

    # ---- shared plumbing --------------------------------------------------------------------------
    def collect(self, stage: str, **values: torch.Tensor) -> None:
        """Keep a step's outputs, on their device (nothing is read back before the epoch ends)."""
        store = self.collected[stage]
        for key, value in values.items():
            store[key].append(value.detach())

    def collected_outputs(self, stage: str) -> dict[str, torch.Tensor] | None:
        """This stage's collected tensors as float32 on the CPU (every process's, in rank order, under DDP),
        then reset; None when empty."""
        store = self.collected[stage]
        if not self.collected_keys or not store[self.collected_keys[0]]:
            return None
        outputs = {}
        for key, parts in store.items():
            values = torch.cat(parts).float()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                values = torch.cat(gather_all_tensors(values))  # ranks may hold different counts
            outputs[key] = values.cpu()
            parts.clear()
        return outputs

    def loss_sums(self, device: torch.device) -> torch.Tensor:
        """The training loss x windows since the last log and in the epoch, on `device` (made at the first step)."""
        sums = self.__dict__["_loss_sums"]
        if sums is None or sums.device != device:
            sums = self.__dict__["_loss_sums"] = torch.zeros(2, device=device)
            self._loss_counts = [0, 0]
        return sums

    def log_training_loss(self, loss: torch.Tensor, batch_size: int, batch_idx: int) -> None:
        """The training loss, summed on the device instead of read back every step: every
        `trainer.log_every_n_steps` steps the mean since the last log goes to the loggers (`train/loss_step`),
        and at the epoch's last batch the epoch's mean, weighted by windows, to the loggers, the progress
        bar and the callbacks (`train/loss`). The only reads are those logs'."""
        self.loss_sums(loss.device).add_(loss.detach().float(), alpha=batch_size)
        self.count_training_loss(batch_size, batch_idx)

    def count_training_loss(self, batch_size: int, batch_idx: int) -> None:
        """The host's side of `log_training_loss`, for a step that added its loss to `loss_sums` itself (a
        captured step): the windows counted, and the logs due after this batch."""
        sums = self.__dict__["_loss_sums"]
        self._loss_counts = [count + batch_size for count in self._loss_counts]
        trainer = self._trainer
        if trainer is None:
            return
        if (trainer.global_step + 1) % max(1, trainer.log_every_n_steps) == 0:
            if trainer.loggers and trainer.is_global_zero:  # straight to the loggers: self.log costs more than a step
                value = float(sums[0] / self._loss_counts[0])
                for logger in trainer.loggers:
                    logger.log_metrics({"train/loss_step": value}, step=trainer.global_step)
            sums[0].zero_()
            self._loss_counts[0] = 0
        if trainer.is_last_batch or batch_idx + 1 >= trainer.num_training_batches:
            self.log("train/loss", sums[1] / self._loss_counts[1], on_step=False, on_epoch=True, prog_bar=True,
                     batch_size=1)
            sums[1].zero_()
            self._loss_counts[1] = 0

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """A batch dict (of tensors, and dicts of tensors per modality) moved to `device`, tensors already there
        kept: Lightning's generic walk over nested collections costs a sizeable share of a small model's step.
        Other batches go the generic way."""
        if not isinstance(batch, dict):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        return {key: _to_device(value, device) for key, value in batch.items()}

    def _epoch_end(self, stage: str) -> None:
        outputs = self.collected_outputs(stage)
        if outputs is not None:
            self.epoch_end(stage, outputs)

    def on_train_epoch_end(self) -> None:
        self._epoch_end("train")

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test")

    def predict_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self(batch)

    def setup(self, stage: str) -> None:
        """At fit: keep the training datamodule's describe() for the header (testing or scoring other
        data later keeps it). A datamodule of your own that is not an EmpathyData (datamodules/protocol.py)
        is recorded by its class name only, so the header (and the app's model card) says no more about the
        data than that."""
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if stage == "fit" and datamodule is not None:
            self.data_description = (datamodule.describe() if isinstance(datamodule, EmpathyData)
                                     else {"datamodule": f"{type(datamodule).__module__}.{type(datamodule).__qualname__}"})

    def header(self) -> dict[str, Any]:
        """The checkpoint header (HEADER_KEY)."""
        if self._commit is None:
            self._commit = git_commit()
        net = str(self.hparams.net["_target_"])
        return {"module": self.registered_name, "model": registered_name(net) or net, "format": HEADER_FORMAT,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": self._commit,
                "data": self.data_description, **self.describe()}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[HEADER_KEY] = self.header()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.data_description = dict(checkpoint[HEADER_KEY]["data"])

    def parameter_groups(self) -> list:
        """What the optimizer trains (parameters or parameter groups); empty: nothing to train."""
        return [p for p in self.parameters() if p.requires_grad]

    def configure_optimizers(self):
        params = self.parameter_groups()
        if not params:  # parameter-free baseline: Lightning runs the epochs without an optimizer
            return None
        optimizer = hydra.utils.instantiate(self.optimizer_cfg)(params)
        if not self.scheduler_cfg:
            return optimizer
        scheduler_cfg = dict(self.scheduler_cfg)
        lightning = {k: scheduler_cfg.pop(k) for k in ("interval", "frequency") if k in scheduler_cfg}
        scheduler = hydra.utils.instantiate(scheduler_cfg)(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, **lightning}}


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device, non_blocking=True)
    if isinstance(value, dict):
        return {key: _to_device(item, device) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not any(isinstance(v, (torch.Tensor, dict)) for v in value):
        return value  # plain values (texts, ids)
    from lightning.fabric.utilities.apply_func import move_data_to_device

    return move_data_to_device(value, device)
