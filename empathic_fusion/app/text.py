"""The Text tab's model: one adapter to the text scorer, its persona inputs, and the flag CSV."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


def load_text_scorer(path: str | Path):
    """The one place the app loads a text model (switch the loader here when the format changes)."""
    from empathic_fusion.text.scorer import TextScorer

    return TextScorer.load(path)


@dataclass(frozen=True)
class PersonaInput:
    column: str
    choices: list[str] | None  # categories seen in training; None: a number (z-scored with training stats)


def persona_inputs(scorer) -> list[PersonaInput]:
    """The persona columns the model was trained with ([] when it was trained without persona)."""
    if scorer.module.net.persona is None:
        return []
    encoder = scorer.persona
    return [PersonaInput(c, list(encoder.categorical[c]) if c in encoder.categorical else None)
            for c in encoder.columns]


def score_text(scorer, texts: dict[str, str], persona: dict[str, object]) -> dict[str, float]:
    """Scores of one row: every output (and the overall mean); empty persona values count as unknown."""
    table = None
    if persona:
        table = pd.DataFrame({c: [None if v in ("", None) else v] for c, v in persona.items()})
    scores = scorer.score({f: [texts.get(f, "")] for f in scorer.fields}, table)
    return {name: float(scores[name][0]) for name in scorer.output_names}


def append_flag(path: Path, texts: dict[str, str], persona: dict[str, object], scores: dict[str, float]) -> Path:
    """Append one flagged row (texts, persona inputs, scores) to the CSV, writing its header first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {**texts, **{f"persona_{k}": v for k, v in persona.items()}, **scores}
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)
    return path
