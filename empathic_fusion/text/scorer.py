"""Score new texts with a trained text checkpoint (the Lightning checkpoint train.py writes).

The checkpoint describes itself (empathic_fusion/text/model.py): net and encoder config, fields, labels,
persona vocabulary and target scaling; a frozen encoder's weights are not in it (they are reloaded
from the encoder folder, whose identity hash is checked). `serve.py` and the robustness report
score through `TextScorer`, which runs the module's `predict_step` with the one predict helper
(empathic_fusion/models/predict.py) over a predict split of the text datamodule
(`TextDataModule.for_checkpoint`): the batches are built as in training. Checkpoints are read by the
one loader (empathic_fusion/models/checkpoints.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from empathic_fusion.core.errors import MissingFileError
from empathic_fusion.models.base import EmpathyLightningModule
from empathic_fusion.models.checkpoints import load_module
from empathic_fusion.models.predict import predict
from empathic_fusion.text.data import PersonaEncoder
from empathic_fusion.text.datamodule import TextDataModule
from empathic_fusion.text.report import OVERALL


class TextScorer:
    """Scores texts with a trained module: one score per label plus the overall mean."""

    def __init__(self, module: EmpathyLightningModule, accelerator: str = "cpu"):
        """`module`: a text module (empathic_fusion/text/model.py's TextEmpathyModule)."""
        self.module = module.eval()
        self.accelerator = accelerator

    @classmethod
    def load(cls, path: str | Path, accelerator: str = "cpu") -> "TextScorer":
        """A text checkpoint file, or a run folder's best checkpoint."""
        path = Path(path)
        if not path.exists():
            raise MissingFileError(f"text checkpoint {path} does not exist (python train.py "
                                    "experiment=text_empathetic_exchanges writes <run>/checkpoints/*.ckpt)")
        return cls(load_module(path, kind="text"), accelerator)

    @property
    def persona(self) -> PersonaEncoder:
        """The persona columns and vocabulary the model was trained with (empty columns: none)."""
        return self.module.persona_encoder

    @property
    def fields(self) -> list[str]:
        return self.module.net.fields

    @property
    def output_names(self) -> list[str]:
        names = list(self.module.label_names)
        return names + [OVERALL] if len(names) > 1 else names

    def datamodule(self, fields: dict[str, list[str]], persona: pd.DataFrame | None = None) -> TextDataModule:
        """The rows as a predict split of the checkpoint's text datamodule; a field left out is empty
        text, persona left out is 'unknown'."""
        n = max(len(v) for v in fields.values())
        rows = pd.DataFrame({f: list(fields.get(f, [""] * n)) for f in self.fields})
        for column in self.persona.columns:
            rows[column] = persona[column].to_numpy() if persona is not None and column in persona else None
        info = self.module.hparams.data_info
        data_cfg = (self.module.hparams.run_config or {}).get("data") or {
            "text_columns": list(info["fields"]), "label_columns": list(info["labels"]),
            "persona_columns": list(self.persona.columns), "levels": info.get("levels")}
        return TextDataModule.for_checkpoint(data_cfg, info, rows, self.module.frozen_encoder)

    def score(self, fields: dict[str, list[str]], persona: pd.DataFrame | None = None,
              progress: bool = False) -> dict[str, np.ndarray]:
        """Scores for N rows (raw: not clipped to the label scale), through trainer.predict."""
        pred = predict(self.module, self.datamodule(fields, persona), self.accelerator, progress).numpy()
        out = {name: pred[:, j] for j, name in enumerate(self.module.label_names)}
        if len(self.module.label_names) > 1:
            out[OVERALL] = pred.mean(1)
        return out
