"""The one predict helper: a module's `predict_step` over a datamodule's predict split, through
`trainer.predict`, so scoring builds its batches exactly as training did. The web app's scorers,
`empathic-predict` and the text robustness report call it."""
from __future__ import annotations

import lightning as L
import numpy as np
import pandas as pd
import torch

from empathic_fusion.datamodules.text_datamodule import TextDataModule
from empathic_fusion.models.text_module import OVERALL, TextEmpathyModule
from empathic_fusion.utils.progress import ScoringProgress


def predict(module: L.LightningModule, datamodule: L.LightningDataModule, accelerator: str = "cpu",
            progress: bool = False, unit: str = "row") -> torch.Tensor:
    """The module's outputs for every row of the predict split, concatenated, as float32 on the CPU;
    `progress` shows a bar counting the `unit`s scored (a window, a row)."""
    trainer = L.Trainer(accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[ScoringProgress(unit)] if progress else [])
    return torch.cat(trainer.predict(module, datamodule=datamodule)).float().cpu()


def text_datamodule(module: TextEmpathyModule, fields: dict[str, list[str]],
                    persona: pd.DataFrame | None = None) -> TextDataModule:
    """Rows of texts as a predict split of a text module's datamodule; `fields` as the model reads them
    (derived ones built), a field left out is empty text, persona left out is 'unknown'."""
    n = max(len(v) for v in fields.values())
    rows = pd.DataFrame({f: list(fields.get(f, [""] * n)) for f in module.net.fields})
    for column in module.persona_encoder.columns:
        rows[column] = persona[column].to_numpy() if persona is not None and column in persona else None
    return TextDataModule.for_checkpoint(module.data_config(), module.hparams.data_info, rows,
                                         module.frozen_encoder, module.net.layer_sets)


def predict_texts(module: TextEmpathyModule, fields: dict[str, list[str]], persona: pd.DataFrame | None = None,
                  accelerator: str = "cpu", progress: bool = False) -> dict[str, np.ndarray]:
    """A text module's scores for N rows per output (`module.output_names`; raw: not clipped to the label
    scale), through trainer.predict."""
    pred = predict(module, text_datamodule(module, fields, persona), accelerator, progress).numpy()
    out = {name: pred[:, j] for j, name in enumerate(module.label_names)}
    if len(module.label_names) > 1:
        out[OVERALL] = pred.mean(1)
    return out
