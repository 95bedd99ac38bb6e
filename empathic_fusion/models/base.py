"""The base of every model's LightningModule: fusion nets (models/empathy_module.py) and text models
(text/model.py) train, test, save and report through it, so the pipeline has one path for all.

Every module is built the same way (`empathic_fusion.pipeline.train`):
`hydra.utils.instantiate(cfg.model, data_info=datamodule.fitted_state(), run_config=..., _recursive_=False)`,
where `cfg.model._target_` names the module class and `net._target_` the network inside. The base
owns
- the optimizer and scheduler, built from the `_partial_` configs of conf/optimizer and
  conf/scheduler (the composed model config holds them; no defaults live in code),
- the collection of per-stage outputs (`collect`; torchmetrics CatMetric, gathered across processes),
- a self-describing checkpoint header, `checkpoint["empathic_fusion"]` (`HEADER_KEY`): the module's
  and its net's registered names (`module`, `model`; empathic_fusion/core/registry.py, so
  models/checkpoints.py rebuilds any checkpoint, and moving a class does not break it), its format,
  when and from which commit it was written, the datamodule's `describe()` ("data") and the
  subclass's `describe()`,
- `predict_step`, and the `report()` hook the pipeline calls after testing.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from torchmetrics import CatMetric

from empathic_fusion.core.registry import registered_name
from empathic_fusion.datamodules.protocol import EmpathyData
from empathic_fusion.evaluation.groups import check_attributes
from empathic_fusion.utils.loggers import git_commit

STAGES = ("train", "val", "test")
HEADER_KEY = "empathic_fusion"
HEADER_FORMAT = 3  # 3: registered names (module, model); 2: a dotted class path (class, net)


def build_module(model_cfg: dict[str, Any], data_info: dict[str, Any],
                 run_config: dict[str, Any]) -> "EmpathyLightningModule":
    """The LightningModule a model config names (`_target_`), for data described by `data_info`."""
    return hydra.utils.instantiate(model_cfg, data_info=data_info, run_config=run_config, _recursive_=False,
                                   _convert_="all")


class EmpathyLightningModule(L.LightningModule):
    """Shared training, checkpoint and report plumbing; subclasses define the net, the step and
    `describe()`, `epoch_end()` and `report()`.

    `collected_keys` names the tensors a subclass collects per stage with `collect` (read back,
    gathered and reset, by `collected_outputs`)."""

    collected_keys: tuple[str, ...] = ()
    registered_name: str  # set by @register_model: what a checkpoint header calls the module ("fusion", "text")

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

    @property
    def kind(self) -> str:
        """What this module is ("fusion", "text"): its registered name, so callers ask instead of probing."""
        return self.registered_name

    def describe(self) -> dict[str, Any]:
        """Model-specific fields of the checkpoint header."""
        return {}

    def epoch_end(self, stage: str, outputs: dict[str, torch.Tensor]) -> None:
        """Metrics of one stage's collected outputs (called once per epoch, only when there are some)."""

    def report(self, datamodule: L.LightningDataModule, out_dir: Path, evaluation: dict[str, Any],
               loggers: list | tuple = ()) -> dict[str, Any]:
        """Write the test report of the last `trainer.test` (empathic_fusion/evaluation/report.py)."""
        raise NotImplementedError(f"{type(self).__name__} does not define report()")

    def group_attributes(self, datamodule: L.LightningDataModule) -> tuple[list[str], str]:
        """The attributes `evaluation.groups` may name for this model's data, and where they come from."""
        return [], f"{type(self).__name__}'s data"

    def check_groups(self, datamodule: L.LightningDataModule, evaluation: dict[str, Any]) -> None:
        """An unknown `evaluation.groups` attribute is a ConfigError listing the available ones (before the
        report's bootstrap, and in train.py before training)."""
        if evaluation.get("groups"):
            check_attributes(list(evaluation["groups"]), *self.group_attributes(datamodule))

    def evaluation_datamodule(self, data_overrides: dict[str, Any], features_overrides: dict[str, Any],
                              split: str, test_csv: str | None = None) -> EmpathyData:
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

    def instantiate_datamodule(self, data_cfg: dict[str, Any], features_cfg: dict[str, Any]) -> EmpathyData:
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


def build_datamodule(data_cfg: dict[str, Any], features_cfg: dict[str, Any], modalities: list[str]) -> EmpathyData:
    """The datamodule a data config names, for these modalities and this feature config (every
    datamodule takes both: a text table accepts the text modality only)."""
    datamodule = hydra.utils.instantiate(data_cfg, modalities=list(modalities), features=features_cfg, _convert_="all")
    if not isinstance(datamodule, EmpathyData):
        raise TypeError(f"data._target_={data_cfg.get('_target_')} built a {type(datamodule).__name__}, which lacks "
                        "part of the datamodule interface (empathic_fusion/datamodules/protocol.py EmpathyData)")
    return datamodule
