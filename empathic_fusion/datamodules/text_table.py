"""Text tables (CSV or JSONL) with numeric labels: validation, turn context, persona, grouped K-fold.

One row is one scored text. Besides the text column(s) and label column(s) a table may carry:
- a group column (writer, conversation): folds never split a group;
- context columns (e.g. the speaker turn a listener answers), each encoded as its own field;
- an order column: with `context_turns: k`, the text of the k preceding rows of the same group
  (ordered by it) becomes one more field, `previous_turns` (empty when there is none). It is derived,
  never read from the table: training and scoring (`empathic-predict`, the app) build it from the group
  and order columns with `text_fields` (`TextTableSpec.input_columns` are the columns a row to score needs);
- persona columns ("Talk, Listen, Connect": gender, empathic concern, ...): strings are categories, numbers are
  standardised with training-fold statistics; missing values get their own category / 0.
Rows with a missing label are an error (named by line); missing texts become "".
"""
from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from empathic_fusion.config.inputs import missing_data_hint
from empathic_fusion.core.errors import MissingFileError, UserError
from empathic_fusion.dataset.contract import EncodingProblem, decode_text
from empathic_fusion.datamodules.splits import group_folds, group_holdout

PREVIOUS_TURNS = "previous_turns"


@dataclass
class TextTableSpec:
    """Which columns of a table mean what (the data config's keys)."""

    text_columns: list[str]
    label_columns: list[str]
    group_column: str | None = None
    context_columns: list[str] = field(default_factory=list)
    persona_columns: list[str] = field(default_factory=list)
    order_column: str | None = None
    context_turns: int = 0

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> "TextTableSpec":
        """The spec a data config (or a checkpoint's run config "data") describes; a single column may be a string."""
        as_list = (lambda v: [v] if isinstance(v, str) else list(v or []))
        return cls(as_list(data.get("text_columns")), as_list(data.get("label_columns")), data.get("group_column"),
                   as_list(data.get("context_columns")), as_list(data.get("persona_columns")),
                   data.get("order_column"), int(data.get("context_turns") or 0))

    @property
    def fields(self) -> list[str]:
        """Names of the text fields each row is encoded into, in model input order."""
        return list(self.text_columns) + list(self.context_columns) + ([PREVIOUS_TURNS] if self.context_turns > 0 else [])

    @property
    def conversation_columns(self) -> list[str]:
        """The columns `previous_turns` is built from (group, then order), or none without context turns."""
        if self.context_turns <= 0:
            return []
        return [c for c in (self.group_column, self.order_column) if c]

    @property
    def input_columns(self) -> list[str]:
        """The table columns a row to score needs: its texts, and the conversation columns the derived
        fields are built from (never a derived field itself). Labels and persona are not among them."""
        return list(dict.fromkeys(self.text_columns + self.context_columns + self.conversation_columns))

    def inputs_note(self) -> str:
        """What the model reads, for messages: the raw columns and what is built from them."""
        note = f"the model reads column(s) {self.input_columns}"
        if self.conversation_columns:
            note += (f" ({PREVIOUS_TURNS} is built from {' and '.join(self.conversation_columns)}: the "
                     f"{self.context_turns} preceding turn(s) of the same {self.group_column}, as in training)")
        return note


class TextTableError(UserError, ValueError):
    """A text table that does not fit its data config (missing columns, non-numeric labels, no rows); the
    message lists every problem with the table's name."""


def read_table(path: str | Path, source: str | None = None) -> pd.DataFrame:
    """CSV, TSV or JSON lines, by suffix; a missing table names data.path= and where the data comes from
    (`source`, the data config's). Text is read as the dataset contract reads its tables: UTF-8, or the
    encoding a byte-order mark names (Excel's "Unicode text" is UTF-16 with one); any other encoding stops
    with the table, line and byte."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"text table {path} does not exist{missing_data_hint('data.path', source)}")
    try:
        text = io.StringIO(decode_text(path.read_bytes()))
    except EncodingProblem as problem:
        raise TextTableError(f"text table {path}, line {problem.line}: {problem.message}") from None
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".ndjson"}:
        return pd.read_json(text, lines=True)
    if suffix == ".json":
        return pd.read_json(text)
    return pd.read_csv(text, sep="\t" if suffix == ".tsv" else ",")


def validate(table: pd.DataFrame, spec: TextTableSpec, source: str = "table") -> None:
    """Every named column exists and every label is a number; all problems in one error."""
    problems = []
    if not spec.text_columns:
        problems.append("no text_columns given")
    if not spec.label_columns:
        problems.append("no label_columns given")
    named = spec.text_columns + spec.label_columns + spec.context_columns + spec.persona_columns \
        + [c for c in (spec.group_column, spec.order_column) if c]
    missing = [c for c in dict.fromkeys(named) if c not in table.columns]
    if missing:
        problems.append(f"missing column(s) {missing}; the table has {list(table.columns)}")
    if spec.context_turns > 0 and not spec.group_column:
        problems.append("context_turns > 0 needs a group_column (the conversation)")
    if spec.context_turns < 0:
        problems.append(f"context_turns must be >= 0, got {spec.context_turns}")
    for column in spec.label_columns:
        if column not in table.columns:
            continue
        values = pd.to_numeric(table[column], errors="coerce")
        bad = np.flatnonzero(values.isna().to_numpy())
        for i in bad[:5]:
            problems.append(f"{source}, line {i + 2}, field {column!r}: {table[column].iloc[i]!r} is not a number")
        if len(bad) > 5:
            problems.append(f"... and {len(bad) - 5} more rows with a non-numeric {column!r}")
    if len(table) == 0:
        problems.append("the table has no rows")
    if problems:
        raise TextTableError(f"{source}: " + "; ".join(problems))


def text_fields(table: pd.DataFrame, spec: TextTableSpec) -> dict[str, list[str]]:
    """The strings of every field per row; `previous_turns` joins the k preceding turns of the group."""
    fields = {c: table[c].fillna("").astype(str).tolist() for c in spec.text_columns + spec.context_columns}
    if spec.context_turns > 0:
        turn_text = table[spec.text_columns[0]].fillna("").astype(str)
        if len(spec.text_columns) > 1 or spec.context_columns:
            parts = [table[c].fillna("").astype(str) for c in spec.context_columns + spec.text_columns]
            turn_text = parts[0].str.cat(parts[1:], sep=" ") if len(parts) > 1 else parts[0]
        order = _order(table[spec.order_column]) if spec.order_column else pd.Series(np.arange(len(table)), index=table.index)
        frame = pd.DataFrame({"g": table[spec.group_column].astype(str), "o": order, "t": turn_text,
                              "i": np.arange(len(table))}).sort_values(["g", "o", "i"], kind="stable")
        previous = [""] * len(table)
        for _, rows in frame.groupby("g", sort=False):
            texts = rows.t.tolist()
            for j, i in enumerate(rows.i.tolist()):
                previous[i] = join_turns(texts[:j], spec.context_turns)
        fields[PREVIOUS_TURNS] = previous
    return fields


def _order(values: pd.Series) -> pd.Series:
    """An order column as numbers when every value given is one (a table read as text, as `empathic-predict`
    reads it, then orders turns 2 before 10 as training did), else as it is."""
    given = values.replace("", np.nan)
    numbers = pd.to_numeric(given, errors="coerce")
    return numbers if numbers.notna().sum() == given.notna().sum() else values


def join_turns(turns: Sequence[str], k: int) -> str:
    """`previous_turns` of a row from the texts of the turns before it in its conversation (oldest first):
    the last k, joined by a space; the one rule for training, scoring a table and the app's typed turns."""
    return " ".join(list(turns)[-k:]) if k > 0 else ""


def labels(table: pd.DataFrame, spec: TextTableSpec) -> np.ndarray:
    return table[spec.label_columns].apply(pd.to_numeric).to_numpy(dtype=np.float32)


def grouped_folds(table: pd.DataFrame, spec: TextTableSpec, n_folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) row indices per fold from the project's one splitter
    (empathic_fusion/datamodules/splits.py): grouped when a group column is given, stratified by the
    (rounded) first label where possible so every fold sees every level; shuffled rows otherwise."""
    if not spec.group_column:
        return group_folds(len(table), n_folds, seed)
    groups = table[spec.group_column].astype(str).to_numpy()
    strata = _strata(np.round(labels(table, spec)[:, 0]).astype(int), n_folds)
    try:
        return group_folds(len(table), n_folds, seed, groups=groups, strata=strata)
    except ValueError as error:  # name the column whose groups are too few
        raise ValueError(f"{error} (group column {spec.group_column!r})") from None


def _strata(levels: np.ndarray, n_folds: int) -> np.ndarray:
    """Label levels for stratification; a level with fewer than n_folds rows joins its nearest larger one."""
    values, counts = np.unique(levels, return_counts=True)
    common = values[counts >= n_folds]
    if len(common) == 0:
        return np.zeros_like(levels)
    return np.array([v if v in common else common[np.argmin(np.abs(common - v))] for v in levels])


def inner_validation_split(train_idx: np.ndarray, table: pd.DataFrame, spec: TextTableSpec, fraction: float,
                           seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split a training fold into train / validation (whole groups when a group column is given) for
    early stopping and checkpoints: `fraction` of its groups (or rows), at least one."""
    if fraction <= 0:
        return train_idx, train_idx[:0]
    groups = (table[spec.group_column].astype(str).to_numpy()[train_idx] if spec.group_column
              else np.arange(len(train_idx)))
    n_val = max(1, int(round(len(np.unique(groups)) * fraction)))
    kept, held = group_holdout(groups, n_val, seed)
    return train_idx[kept], train_idx[held]


class PersonaEncoder:
    """Fitted on a training fold: category ids per string column, z-scores per numeric column."""

    def __init__(self, columns: list[str]):
        self.columns = list(columns)
        self.categorical: dict[str, list[str]] = {}
        self.numeric: dict[str, tuple[float, float]] = {}

    def fit(self, table: pd.DataFrame) -> "PersonaEncoder":
        for c in self.columns:
            values = table[c]
            if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
                v = values.astype(float)
                self.numeric[c] = (float(v.mean()), float(v.std(ddof=0)) or 1.0)
            else:
                self.categorical[c] = sorted(values.dropna().astype(str).unique().tolist())
        return self

    @property
    def cardinalities(self) -> list[int]:
        """Vocabulary size per categorical column: its categories plus one 'unknown / missing' id (0)."""
        return [len(v) + 1 for v in self.categorical.values()]

    @property
    def n_numeric(self) -> int:
        return len(self.numeric)

    def transform(self, table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(category ids N x C int64, numeric z-scores N x K float32), missing -> 0."""
        ids = np.zeros((len(table), len(self.categorical)), dtype=np.int64)
        for j, (c, vocab) in enumerate(self.categorical.items()):
            lookup = {v: i + 1 for i, v in enumerate(vocab)}
            ids[:, j] = [lookup.get(str(v), 0) if pd.notna(v) else 0 for v in table[c]]
        numeric = np.zeros((len(table), len(self.numeric)), dtype=np.float32)
        for j, (c, (mean, std)) in enumerate(self.numeric.items()):
            numeric[:, j] = np.nan_to_num((pd.to_numeric(table[c], errors="coerce").to_numpy(float) - mean) / std)
        return ids, numeric

    def state(self) -> dict:
        return {"columns": self.columns, "categorical": self.categorical, "numeric": self.numeric}

    @classmethod
    def from_state(cls, state: dict) -> "PersonaEncoder":
        encoder = cls(state["columns"])
        encoder.categorical = {k: list(v) for k, v in state["categorical"].items()}
        encoder.numeric = {k: tuple(v) for k, v in state["numeric"].items()}
        return encoder
