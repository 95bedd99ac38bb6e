"""The base of every model's LightningModule: fusion nets (models/empathy_module.py) and text models
(text/model.py) train, test, save and report through it, so the pipeline has one path for all.

Every module is built the same way (`empathic_fusion.pipeline.train`):
`hydra.utils.instantiate(cfg.model, data_info=datamodule.fitted_state(), run_config=..., _recursive_=False)`,
where `cfg.model._target_` names the module class and `net._target_` the network inside. The base
owns
- the optimizer and scheduler, built from the `_partial_` configs of conf/optimizer and
  conf/scheduler (the composed model config holds them; no defaults live in code),
- the collection of per-stage outputs (`collect`; torchmetrics CatMetric, gathered across processes),
- a self-describing checkpoint header, `checkpoint["empathic_fusion"]` (`HEADER_KEY`): the module
  class (so `evaluate.py` rebuilds any checkpoint, `load_module`), its format, when and from which
  commit it was written, the datamodule's `describe()` ("data") and the subclass's `describe()`,
- `predict_step`, and the `report()` hook the pipeline calls after testing.
"""
from __future__ import annotations

import importlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from torchmetrics import CatMetric

from empathic_fusion.utils.loggers import git_commit

STAGES = ("train", "val", "test")
HEADER_KEY = "empathic_fusion"
HEADER_FORMAT = 2


def build_module(model_cfg: dict[str, Any], data_info: dict[str, Any],
                 run_config: dict[str, Any]) -> "EmpathyLightningModule":
    """The LightningModule a model config names (`_target_`), for data described by `data_info`."""
    return hydra.utils.instantiate(model_cfg, data_info=data_info, run_config=run_config, _recursive_=False,
                                   _convert_="all")


def read_header(path: str | Path) -> dict[str, Any]:
    """The header of a checkpoint (see the module docstring)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    header = checkpoint.get(HEADER_KEY)
    if not isinstance(header, dict) or "class" not in header:
        raise ValueError(f"{path} has no '{HEADER_KEY}' header naming its module class: it was not written by "
                         f"this version of empathic-fusion (header format {HEADER_FORMAT}); retrain it with train.py")
    return header


def load_module(path: str | Path) -> "EmpathyLightningModule":
    """Any model checkpoint, rebuilt as the class its header names (on the CPU)."""
    header = read_header(path)
    module_name, _, class_name = header["class"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, EmpathyLightningModule)):
        raise ValueError(f"{path}: header class {header['class']} is not an EmpathyLightningModule")
    # weights_only=False: text checkpoints hold fitted vocabularies and ridge coefficients
    return cls.load_from_checkpoint(path, map_location="cpu", weights_only=False)


class EmpathyLightningModule(L.LightningModule):
    """Shared training, checkpoint and report plumbing; subclasses define the net, the step and
    `describe()`, `epoch_end()` and `report()`.

    `collected_keys` names the tensors a subclass collects per stage with `collect` (read back,
    gathered and reset, by `collected_outputs`)."""

    collected_keys: tuple[str, ...] = ()

    def __init__(self, optimizer: dict[str, Any], scheduler: dict[str, Any] | None, data_info: dict[str, Any],
                 run_config: dict[str, Any]):
        super().__init__()
        self.optimizer_cfg = dict(optimizer)
        self.scheduler_cfg = dict(scheduler) if scheduler else None
        self.data_info = dict(data_info)
        self.run_config = dict(run_config)
        self.collected = torch.nn.ModuleDict({
            f"{stage}_outputs": torch.nn.ModuleDict({k: CatMetric(nan_strategy="disable") for k in self.collected_keys})
            for stage in STAGES
        })  # "train" itself would clash with nn.Module.train
        self.results: dict[str, Any] = {}
        self.test_predictions: dict[str, Any] = {}
        self.data_description: dict[str, Any] = {}  # the datamodule's describe(), kept in the header
        self._commit: str | None = None

    # ---- what the subclasses define ---------------------------------------------------------
    @property
    def title(self) -> str:
        """The model's name in reports: its net's class."""
        return str(self.hparams.net["_target_"]).rsplit(".", 1)[-1]

    def describe(self) -> dict[str, Any]:
        """Model-specific fields of the checkpoint header."""
        return {"net": self.hparams.net["_target_"]}

    def epoch_end(self, stage: str, outputs: dict[str, torch.Tensor]) -> None:
        """Metrics of one stage's collected outputs (called once per epoch, only when there are some)."""

    def report(self, datamodule: L.LightningDataModule, out_dir: Path, evaluation: dict[str, Any],
               loggers: list | tuple = ()) -> dict[str, Any]:
        """Write the test report of the last `trainer.test` (empathic_fusion/evaluation/report.py)."""
        raise NotImplementedError(f"{type(self).__name__} does not define report()")

    def evaluation_datamodule(self, data_overrides: dict[str, Any], features_overrides: dict[str, Any],
                              split: str, test_csv: str | None = None) -> L.LightningDataModule:
        """The datamodule of the run this checkpoint was trained in (data.* / features.* overrides
        applied), set up so that its test split is `split` (test or val)."""
        if test_csv:
            raise ValueError(f"test_csv= scores a text table with a text checkpoint; this checkpoint is a "
                             f"{type(self).__name__}: use data.* overrides instead")
        datamodule = self.instantiate_datamodule({**self.run_config["data"], **data_overrides},
                                                 {**self.run_config["features"], **features_overrides})
        datamodule.prepare_data()
        datamodule.setup("test")
        return datamodule

    def instantiate_datamodule(self, data_cfg: dict[str, Any], features_cfg: dict[str, Any]) -> L.LightningDataModule:
        """A datamodule from a data config, with this run's modalities and feature config (as train does)."""
        return build_datamodule(data_cfg, features_cfg, self.run_config["modality"]["names"])

    # ---- shared plumbing --------------------------------------------------------------------------
    def collect(self, stage: str, **values: torch.Tensor) -> None:
        store = self.collected[f"{stage}_outputs"]
        for key, value in values.items():
            store[key].update(value.detach().float())

    def collected_outputs(self, stage: str) -> dict[str, torch.Tensor] | None:
        """This stage's collected tensors (on the CPU, every process's under DDP), then reset; None when empty."""
        store = self.collected[f"{stage}_outputs"]
        if not self.collected_keys or store[self.collected_keys[0]].update_count == 0:
            return None
        outputs = {key: metric.compute().cpu() for key, metric in store.items()}
        for metric in store.values():
            metric.reset()
        return outputs

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
        data later keeps it). A datamodule of your own without describe() is recorded by its class name
        only, so the header (and the app's model card) says no more about the data than that."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if stage == "fit" and datamodule is not None:
            describe = getattr(datamodule, "describe", None)
            self.data_description = (describe() if callable(describe)
                                     else {"datamodule": f"{type(datamodule).__module__}.{type(datamodule).__qualname__}"})

    def header(self) -> dict[str, Any]:
        """The checkpoint header (HEADER_KEY)."""
        if self._commit is None:
            self._commit = git_commit()
        cls = type(self)
        return {"class": f"{cls.__module__}.{cls.__qualname__}", "format": HEADER_FORMAT,
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


def build_datamodule(data_cfg: dict[str, Any], features_cfg: dict[str, Any], modalities: list[str]) -> L.LightningDataModule:
    """The datamodule a data config names, for these modalities and this feature config (every
    datamodule takes both: a text table accepts the text modality only)."""
    return hydra.utils.instantiate(data_cfg, modalities=list(modalities), features=features_cfg, _convert_="all")
