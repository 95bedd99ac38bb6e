"""Score new texts with a trained text checkpoint (the Lightning checkpoint train.py writes).

The checkpoint describes itself (empathic_fusion/models/text_module.py): net and encoder config, fields, labels,
persona vocabulary and target scaling; a frozen encoder's weights are not in it (they are reloaded
from the encoder folder, whose identity hash is checked). `serve.py` and `empathic-predict` score
through `TextScorer`, which runs the module's `predict_step` with the one predict helper
(empathic_fusion/models/predict.py) over a predict split of the text datamodule
(`TextDataModule.for_checkpoint`): the batches are built as in training, and so are derived fields
(`build_fields`: `previous_turns` from a table's group and order columns). Checkpoints are read by the
one loader (empathic_fusion/models/checkpoints.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from empathic_fusion.core.errors import MissingFileError
from empathic_fusion.datamodules.text_table import PersonaEncoder, TextTableError, TextTableSpec, text_fields
from empathic_fusion.models.checkpoints import load_module
from empathic_fusion.models.predict import predict_texts
from empathic_fusion.models.text_module import TextEmpathyModule


class TextScorer:
    """Scores texts with a trained module: one score per label plus the overall mean."""

    def __init__(self, module: TextEmpathyModule, accelerator: str = "cpu"):
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
        """The fields the model reads, derived ones (`previous_turns`) included."""
        return self.module.net.fields

    @property
    def spec(self) -> TextTableSpec:
        """The column roles of the training table (which columns the derived fields are built from)."""
        return TextTableSpec.from_config(self.module.data_config())

    @property
    def input_columns(self) -> list[str]:
        """The columns a table to score needs: texts, and the group / order columns of the derived fields."""
        return self.spec.input_columns

    @property
    def output_names(self) -> list[str]:
        return self.module.output_names

    def build_fields(self, table: pd.DataFrame) -> dict[str, list[str]]:
        """Every field the model reads for each row of a table with the raw columns (`input_columns`),
        derived ones built as training built them (datamodules/text_table.py `text_fields`: `previous_turns` from the
        rows of the same group, in order). Raises TextTableError naming the columns it lacks."""
        spec = self.spec
        missing = [c for c in spec.input_columns if c not in table.columns]
        if missing:
            raise TextTableError(f"missing column(s) {missing}; {spec.inputs_note()}; found {list(table.columns)}")
        return text_fields(table.reset_index(drop=True), spec)

    def score(self, fields: dict[str, list[str]], persona: pd.DataFrame | None = None,
              progress: bool = False) -> dict[str, np.ndarray]:
        """Scores for N rows (raw: not clipped to the label scale), through the one predict loop."""
        return predict_texts(self.module, fields, persona, self.accelerator, progress)
