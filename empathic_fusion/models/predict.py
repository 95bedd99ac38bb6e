"""The one predict helper: a module's `predict_step` over a datamodule's predict split, through
`trainer.predict`, so scoring builds its batches exactly as training did. The web app's scorers
and `empathic-predict` call it."""
from __future__ import annotations

import lightning as L
import torch

from empathic_fusion.utils.progress import ScoringProgress


def predict(module: L.LightningModule, datamodule: L.LightningDataModule, accelerator: str = "cpu",
            progress: bool = False, unit: str = "row") -> torch.Tensor:
    """The module's outputs for every row of the predict split, concatenated, as float32 on the CPU;
    `progress` shows a bar counting the `unit`s scored (a window, a row)."""
    trainer = L.Trainer(accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[ScoringProgress(unit)] if progress else [])
    return torch.cat(trainer.predict(module, datamodule=datamodule)).float().cpu()
