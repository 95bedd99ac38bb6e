"""A trained text model as one file (`model.pt`) and a scorer for new texts.

The bundle holds the model settings, the trainable weights (a frozen encoder's weights are not
copied: it is reloaded from its local folder), the persona encoder state and the label names, so
`serve.py` and the robustness report can score text without the training data.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from src.text.data import PersonaEncoder
from src.text.encoder import TextEncoder
from src.text.model import OVERALL, TextRegressor, TextRegressorModule


def embed_fields(encoder: TextEncoder, texts: dict[str, list[str]], fields: list[str]) -> torch.Tensor:
    """Frozen-encoder embeddings of every field, concatenated in field order (N x fields*dim)."""
    return torch.cat([encoder(texts[f]) for f in fields], dim=-1)


def build_module(settings: dict, label_names: list[str], fields: list[str], persona: PersonaEncoder,
                 target_mean: np.ndarray, target_std: np.ndarray, levels: tuple[int, int] | None,
                 encoder: TextEncoder | None = None) -> TextRegressorModule:
    """A fresh module from the model config keys (encoder, head, persona, optimizer)."""
    enc_cfg = settings.get("encoder", {})
    encoder = encoder or TextEncoder(enc_cfg.get("model_path"), enc_cfg.get("trainable_layers", 0),
                                     enc_cfg.get("max_length", 128), enc_cfg.get("batch_size", 64))
    use_persona = bool(settings.get("use_persona", True)) and bool(persona.columns)
    head = settings.get("head", {})
    net = TextRegressor(fields, len(label_names), encoder.dim, None if encoder.frozen else encoder,
                        hidden=head.get("hidden", 256), dropout=head.get("dropout", 0.1),
                        persona_cardinalities=persona.cardinalities if use_persona else None,
                        persona_numeric=persona.n_numeric if use_persona else 0,
                        persona_dim=settings.get("persona_dim", 8))
    opt = settings.get("optimizer", {})
    return TextRegressorModule(net, label_names, target_mean, target_std, levels, lr=opt.get("lr", 1e-3),
                               encoder_lr=opt.get("encoder_lr", 2e-5), weight_decay=opt.get("weight_decay", 0.01))


def save_bundle(path: Path, module: TextRegressorModule, settings: dict, persona: PersonaEncoder) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"settings": settings, "label_names": module.label_names, "fields": module.net.fields,
                "persona": persona.state(), "levels": module.levels,
                "target_mean": module.target_mean.cpu().numpy(), "target_std": module.target_std.cpu().numpy(),
                "state_dict": module.trainable_state()}, path)
    return path


class TextScorer:
    """Scores texts with a saved bundle: one score per label plus the overall mean."""

    def __init__(self, module: TextRegressorModule, persona: PersonaEncoder, encoder: TextEncoder):
        self.module = module.eval()
        self.persona = persona
        self.encoder = encoder

    @classmethod
    def load(cls, path: str | Path, encoder: TextEncoder | None = None) -> "TextScorer":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"text model bundle {path} does not exist (train.py ... model=text_regressor writes model.pt)")
        bundle = torch.load(path, map_location="cpu", weights_only=False)
        persona = PersonaEncoder.from_state(bundle["persona"])
        if encoder is None:
            enc = bundle["settings"].get("encoder", {})
            encoder = TextEncoder(enc.get("model_path"), enc.get("trainable_layers", 0), enc.get("max_length", 128),
                                  enc.get("batch_size", 64))
        module = build_module(bundle["settings"], bundle["label_names"], bundle["fields"], persona,
                              bundle["target_mean"], bundle["target_std"], bundle["levels"], encoder)
        missing, unexpected = module.load_state_dict(bundle["state_dict"], strict=False)
        if missing or unexpected:
            raise ValueError(f"{path}: weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return cls(module, persona, encoder)

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
        if self.module.net.encoder is None:  # frozen: embeddings from the (caching) encoder
            batch["embeddings"] = embed_fields(self.encoder, texts, self.fields)
        with torch.no_grad():
            pred = self.module.predict_scores(batch).cpu().numpy()
        out = {name: pred[:, j] for j, name in enumerate(self.module.label_names)}
        if len(self.module.label_names) > 1:
            out[OVERALL] = pred.mean(1)
        return out
