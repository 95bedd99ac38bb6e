"""Score a text table with a text checkpoint: one row of scores per input row, the input columns kept.

The table needs the columns the checkpoint's text fields come from (`TextScorer.input_columns`: its text
columns and, for a model that reads the previous turns, the group and order columns those are built
from, as in training); its labels are not needed (and not read). Persona
columns the model was trained with are read when present; a missing column, an unseen category or a
number that does not parse counts as unknown, with a warning. A row whose text fields are all empty
cannot be scored and is kept with the reason. Scores go through `TextScorer` (the checkpoint's predict
split and the one predict loop, whose encoder warns about texts in languages it was not trained for), are
clipped to the label scale and carry the model card's interval (each output's split-conformal half-width).
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from empathic_fusion.core.errors import UserError
from empathic_fusion.dataset.contract import EncodingProblem, decode_text
from empathic_fusion.evaluation.card import ModelCard
from empathic_fusion.scoring.text import TextScorer
from empathic_fusion.utils.run_output import warn_data

PREFIX = "predicted_"  # score columns: predicted_<output>, so they never collide with the table's own columns


class TableError(UserError, ValueError):
    """A table that cannot be scored at all; the message names the file and what is wrong."""


def read_table(path: Path, fields: list[str], note: str = "") -> pd.DataFrame:
    """The table as strings (every column kept as written); raises TableError naming the file and, when a
    column is missing, what the model reads (`note`)."""
    if not path.is_file():
        raise TableError(f"{path}: file not found (data.path= names the CSV table to score)")
    try:  # UTF-8, or what a byte-order mark names (UTF-16 from Excel), as the dataset contract reads files
        text = decode_text(path.read_bytes())
    except EncodingProblem as problem:
        raise TableError(f"{path}, line {problem.line}: {problem.message}") from None
    try:
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise TableError(f"{path}: cannot be parsed as CSV ({error})") from None
    missing = [f for f in fields if f not in table.columns]
    if missing:
        raise TableError(f"{path}: missing column(s) {missing}; {note or f'the model reads column(s) {fields}'}; "
                         f"found {list(table.columns)}")
    clash = [c for c in table.columns if c.startswith(PREFIX) or c in ("status", "reason")]
    if clash:
        raise TableError(f"{path}: column(s) {clash} would be overwritten by the scores; rename them")
    return table


def _persona(scorer: TextScorer, table: pd.DataFrame, path: Path) -> pd.DataFrame | None:
    """The persona columns as the model reads them; what it cannot read is unknown, with a warning."""
    encoder = scorer.persona
    if not encoder.columns:
        return None
    persona = pd.DataFrame(index=table.index)
    for column in encoder.columns:
        if column not in table.columns:
            warn_data(f"{path}: no persona column '{column}'; every row's '{column}' is unknown to the model")
            persona[column] = None
            continue
        values = table[column].where(table[column].str.strip() != "", None)
        if column in encoder.numeric:
            numbers = pd.to_numeric(values, errors="coerce")
            bad = values.notna() & numbers.isna()
            persona[column] = numbers
        else:
            bad = values.notna() & ~values.isin(encoder.categorical.get(column, []))
            persona[column] = values
        if bad.any():
            lines = ", ".join(str(i + 2) for i in np.flatnonzero(bad.to_numpy())[:5])
            warn_data(f"{path}, field '{column}': {int(bad.sum())} row(s) (lines {lines}{', ...' if bad.sum() > 5 else ''}) "
                      f"hold a value the model did not see in training; it counts as unknown")
    return persona


def score_table(scorer: TextScorer, card: ModelCard, path: Path, progress: bool = True) -> pd.DataFrame:
    """Every row of the table, in order, with its scores (or the reason it has none)."""
    spec = scorer.spec
    table = read_table(path, spec.input_columns, spec.inputs_note())
    texts = spec.text_columns + spec.context_columns
    empty = (table[texts].apply(lambda column: column.str.strip()) == "").all(axis=1).to_numpy()
    out = table.copy()
    names = scorer.output_names
    for name in names:
        out[f"{PREFIX}{name}"] = np.nan
        out[f"{PREFIX}{name}_raw"] = np.nan
        out[f"{PREFIX}{name}_clipped"] = False
        out[f"{PREFIX}{name}_low"] = np.nan
        out[f"{PREFIX}{name}_high"] = np.nan
    out["status"] = np.where(empty, "not scored", "scored")
    out["reason"] = np.where(empty, f"every text field ({', '.join(texts)}) is empty", "")
    rows = np.flatnonzero(~empty)
    if len(rows):
        fields = scorer.build_fields(table)  # over every row: a row's previous turns may be unscored rows
        persona = _persona(scorer, table, path)
        raw = scorer.score({f: [values[i] for i in rows] for f, values in fields.items()},
                           None if persona is None else persona.iloc[rows].reset_index(drop=True), progress)
        for name in names:
            values = [card.clip(float(v)) for v in raw[name]]
            clipped = np.array([v for v, _ in values])
            out.loc[out.index[rows], f"{PREFIX}{name}"] = clipped
            out.loc[out.index[rows], f"{PREFIX}{name}_raw"] = np.asarray(raw[name], dtype=float)
            out.loc[out.index[rows], f"{PREFIX}{name}_clipped"] = [outside for _, outside in values]
            bounds = card.interval_bounds(name, clipped)
            if bounds is not None:
                out.loc[out.index[rows], f"{PREFIX}{name}_low"], out.loc[out.index[rows], f"{PREFIX}{name}_high"] = bounds
    return out
