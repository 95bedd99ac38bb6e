"""The Text tab's model: a text checkpoint with its model card, its inputs (the training table's text
columns, and the conversation's earlier turns for a model that reads them; derived fields are built as in
training, never typed), its persona inputs, and the flag CSV."""
from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from empathic_fusion.evaluation.card import ModelCard, interval_bounds, text_card
from empathic_fusion.core.language import detect_language, is_untrained_language
from empathic_fusion.models.checkpoints import WrongKindError, module_from, open_checkpoint
from empathic_fusion.datamodules.text_table import PREVIOUS_TURNS, join_turns
from empathic_fusion.scoring.text import TextScorer


@dataclass(frozen=True)
class Score:
    """One output's score: clipped to the label scale, the raw model output, and the interval's half-width."""

    value: float
    raw: float
    outside: bool  # the raw score was outside the label scale (value is clipped)
    half_width: float | None  # the run's split-conformal half-width (inf: the whole scale); None: none recorded
    coverage: float | None = None  # the interval's nominal coverage

    def describe(self, name: str, scale: tuple[float, float] | None) -> str:
        text = f"{name}: {self.value:.2f}"
        if self.half_width is not None:
            low, high = interval_bounds(self.value, self.half_width, scale)
            level = f"{self.coverage:.0%} " if self.coverage is not None else ""
            text += f" ({level}conformal interval {low:.2f} to {high:.2f})"
        if self.outside:
            text += f"; the raw score {self.raw:.3f} is outside the {scale[0]:g}-{scale[1]:g} scale and was clipped"
        return text


class TextModel:
    """A text checkpoint (or a run folder's best one), its scorer and its model card."""

    def __init__(self, path: str | Path, accelerator: str = "cpu"):
        try:
            opened = open_checkpoint(path, kind="text")  # read once: the model and its card
        except WrongKindError as error:
            raise WrongKindError(f"{error}: a fusion checkpoint goes to ckpt_path=") from None
        self.ckpt_path = opened.path
        self.scorer = TextScorer(module_from(opened), accelerator)
        self.card: ModelCard = text_card(opened)

    @property
    def inputs(self) -> list[str]:
        """The text columns typed in: the training table's texts, never a derived field."""
        spec = self.scorer.spec
        return spec.text_columns + spec.context_columns

    @property
    def context_turns(self) -> int:
        """How many earlier turns of the conversation the model reads (0: none; data.context_turns)."""
        return self.scorer.spec.context_turns

    @property
    def output_names(self) -> list[str]:
        return self.scorer.output_names

    def language_notes(self, texts: dict[str, str]) -> list[str]:
        """A note for each field whose text is in a language the model's encoder was not trained for
        (none when the encoder's languages are unknown or the language cannot be told)."""
        encoder = self.scorer.module.encoder
        if not encoder.languages:
            return []
        notes = []
        for field, text in texts.items():
            language = detect_language(text or "")
            if is_untrained_language(language, encoder.languages):
                notes.append(f"'{field}' looks like language '{language}', which the text encoder {encoder.name} was "
                             f"not trained for (it knows {', '.join(encoder.languages)}): this score is unreliable")
        return notes

    def row_fields(self, texts: dict[str, str], earlier_turns: Sequence[str] = ()) -> dict[str, list[str]]:
        """One row's fields as the model reads them: the typed texts, and `previous_turns` built from the
        conversation's earlier turns (oldest first) by the rule training used (datamodules/text_table.py `join_turns`)."""
        fields = {f: [texts.get(f) or ""] for f in self.inputs}
        if self.context_turns > 0:
            turns = [t.strip() for t in earlier_turns if t and t.strip()]
            fields[PREVIOUS_TURNS] = [join_turns(turns, self.context_turns)]
        return fields

    def score(self, texts: dict[str, str], persona: dict[str, object],
              earlier_turns: Sequence[str] = ()) -> dict[str, Score]:
        """Scores of one row: every output (and the overall mean); empty persona values count as unknown;
        `earlier_turns`: the conversation's turns before this one, oldest first (models with context turns)."""
        table = None
        if persona:
            table = pd.DataFrame({c: [None if v in ("", None) else v] for c, v in persona.items()})
        raw = self.scorer.score(self.row_fields(texts, earlier_turns), table)
        scores = {}
        for name in self.output_names:
            value = float(raw[name][0])
            clipped, outside = self.card.clip(value)
            scores[name] = Score(clipped, value, outside, self.card.interval(name), self.card.coverage)
        return scores


@dataclass(frozen=True)
class PersonaInput:
    column: str
    choices: list[str] | None  # categories seen in training; None: a number (z-scored with training stats)


def persona_inputs(model: TextModel) -> list[PersonaInput]:
    """The persona columns the model was trained with ([] when it was trained without persona)."""
    scorer = model.scorer
    if scorer.module.net.persona is None:
        return []
    encoder = scorer.persona
    return [PersonaInput(c, list(encoder.categorical[c]) if c in encoder.categorical else None)
            for c in encoder.columns]


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
