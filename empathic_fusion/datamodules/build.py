"""Datamodules built from their config and set up for a device: the one way the pipeline, evaluation and the
benchmarks get a datamodule (`build_datamodule` then `set_up`), for a fusion or a text model alike."""
from __future__ import annotations

from typing import Any

import hydra
import lightning as L

from empathic_fusion.datamodules.protocol import EmpathyData
from empathic_fusion.utils.job_timings import timed


def set_up(datamodule: EmpathyData, trainer: L.Trainer | None, stage: str) -> None:
    """prepare_data and setup(stage) for the device `trainer` runs on: attached before setup, the trainer
    tells the datamodule where batches will be used (Lightning attaches it only inside fit/test, after
    the setup that the model's construction needs). None: the CPU."""
    if trainer is not None:
        datamodule.trainer = trainer
    with timed("setup/prepare"):
        datamodule.prepare_data()
    datamodule.setup(stage)


def build_datamodule(data_cfg: dict[str, Any], features_cfg: dict[str, Any], modalities: list[str]) -> EmpathyData:
    """The datamodule a data config names, for these modalities and this feature config (every
    datamodule takes both: a text table accepts the text modality only)."""
    datamodule = hydra.utils.instantiate(data_cfg, modalities=list(modalities), features=features_cfg, _convert_="all")
    if not isinstance(datamodule, EmpathyData):
        raise TypeError(f"data._target_={data_cfg.get('_target_')} built a {type(datamodule).__name__}, which lacks "
                        "part of the datamodule interface (empathic_fusion/datamodules/protocol.py EmpathyData)")
    return datamodule
