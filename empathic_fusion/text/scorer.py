"""Score new texts with a trained text checkpoint (the Lightning checkpoint train.py writes).

The checkpoint describes itself (empathic_fusion/text/model.py): net and encoder config, fields, labels,
persona vocabulary and target scaling; a frozen encoder's weights are not in it (they are reloaded
from the encoder folder, whose identity hash is checked). `serve.py` and the robustness report
score through `TextScorer`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from empathic_fusion.text.data import PersonaEncoder
from empathic_fusion.text.model import OVERALL, TextEmpathyModule


class TextScorer:
    """Scores texts with a trained module: one score per label plus the overall mean."""

    def __init__(self, module: TextEmpathyModule):
        self.module = module.eval()

    @classmethod
    def load(cls, path: str | Path) -> "TextScorer":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"text checkpoint {path} does not exist (python train.py "
                                    "experiment=text_empathetic_exchanges writes <run>/checkpoints/*.ckpt)")
        return cls(TextEmpathyModule.load_from_checkpoint(path, map_location="cpu", weights_only=False))

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

    def score(self, fields: dict[str, list[str]], persona: pd.DataFrame | None = None) -> dict[str, np.ndarray]:
        """Scores for N rows; a field left out is empty text, persona left out is 'unknown'."""
        n = max(len(v) for v in fields.values())
        texts = {f: list(fields.get(f, [""] * n)) for f in self.fields}
        if persona is None:
            persona = pd.DataFrame({c: [None] * n for c in self.persona.columns})
        ids, numeric = self.persona.transform(persona)
        batch = {"texts": texts, "persona_ids": torch.from_numpy(ids), "persona_numeric": torch.from_numpy(numeric)}
        encoder = self.module.frozen_encoder
        if encoder is not None:  # frozen: embeddings from the (caching) encoder
            batch["embeddings"] = torch.cat([encoder(texts[f]) for f in self.fields], dim=-1).float()
        with torch.no_grad():
            pred = self.module(batch).cpu().numpy()
        out = {name: pred[:, j] for j, name in enumerate(self.module.label_names)}
        if len(self.module.label_names) > 1:
            out[OVERALL] = pred.mean(1)
        return out
