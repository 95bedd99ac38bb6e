"""LightningDataModule over a text table: one fold of a grouped K-fold cross-validation per run.

Like the fusion datamodule, a run tests one fold (`cv_fold` of `cv_folds`); a sweep over
`data.cv_fold` covers them all and `evaluate.py sweep_dir=` aggregates the folds. `cv_fold=null`
trains on every row (a validation part still held out for checkpoints) and tests nothing;
`test_all=true` tests every row (scoring a new table with a trained checkpoint). `predict=true`
makes every row of the table the predict split (models/predict.py): labels are not needed, its
rows hold the fields as the model reads them (`TextScorer` builds the derived `previous_turns` from
the raw columns first, as training does), and the persona encoder and target statistics must come
from a checkpoint (`apply_fitted`, or `for_checkpoint`); `empathic-predict` and the app score this way.
Persona encoder and target statistics are fitted on the training rows only (or come from a
checkpoint, `apply_fitted`). Batches carry the raw strings of every field, persona ids / numbers,
targets and row indices, and, with a frozen `embedder` attached, the cached field embeddings.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

from empathic_fusion.config.data import TextDataConfig
from empathic_fusion.core.registry import register_model
from empathic_fusion.metrics import infer_levels
from empathic_fusion.datamodules.text_table import (
    PREVIOUS_TURNS,
    PersonaEncoder,
    TextTableSpec,
    grouped_folds,
    inner_validation_split,
    labels,
    read_table,
    text_fields,
    validate,
)


class _Rows(Dataset):
    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> int:
        return int(self.rows[i])


_T = TextDataConfig  # every default of a text table's data config lives in its schema (empathic_fusion/config/data.py)


# registered so that the data config of a checkpoint saved before the move (empathic_fusion.text.datamodule) loads
@register_model("text_table", aliases=("empathic_fusion.text.datamodule.TextDataModule",))
class TextDataModule(L.LightningDataModule):
    """Any CSV / JSONL of texts with numeric labels; see empathic_fusion/datamodules/text_table.py for the column roles."""

    def __init__(self, path: str | None, text_columns: list[str], label_columns: list[str],
                 group_column: str | None = None, context_columns: list[str] | None = None,
                 persona_columns: list[str] | None = None, order_column: str | None = None,
                 context_turns: int = _T.context_turns, cv_folds: int = _T.cv_folds, cv_fold: int | None = _T.cv_fold,
                 test_all: bool = _T.test_all, val_fraction: float = _T.val_fraction, batch_size: int = _T.batch_size,
                 split_seed: int = _T.split_seed, levels: list[int] | None = None, max_rows: int | None = None,
                 name: str = _T.name, num_workers: int = _T.num_workers, table: pd.DataFrame | None = None,
                 generated: bool = False, predict: bool = False, modalities: list[str] = ("text",),
                 features: dict[str, Any] | None = None, source: str | None = _T.source):
        """`modalities` and `features` are what the pipeline gives every datamodule: a text table
        serves the text modality only, and its fields are embedded by the model's own encoder, so
        the feature-extraction config (conf/features) does not apply. `source`: where the table comes
        from, for the message when it is missing."""
        super().__init__()
        if list(modalities) != ["text"]:
            raise ValueError(f"a text table (data={name}) serves the text modality only, got modalities "
                             f"{list(modalities)}: use modality=t")
        self.path = path
        self.name = name
        self.modalities = ["text"]
        self.spec = TextTableSpec.from_config(dict(
            text_columns=text_columns, label_columns=label_columns, group_column=group_column,
            context_columns=context_columns, persona_columns=persona_columns, order_column=order_column,
            context_turns=context_turns))
        self.n_folds, self.val_fraction, self.batch_size, self.split_seed = int(cv_folds), val_fraction, batch_size, split_seed
        self.cv_fold = cv_fold
        self.test_all = bool(test_all)
        self.generated = bool(generated)  # the table was generated (the synthetic one), not annotated
        self.source = source
        self.predict = bool(predict)
        self.max_rows = max_rows
        self.num_workers = num_workers
        self._levels_cfg = tuple(levels) if levels else None
        self.table = table
        self.fold: int | None = None
        self.folds: list | None = None
        self.embedder = None  # a frozen SentenceEncoder: batches then carry its cached embeddings
        self.layer_sets: tuple[int, ...] = ()  # with it, the layer sets the model's experts read

    def setup(self, stage: str | None = None) -> None:
        if self.folds is not None:
            return
        table = self.table if self.table is not None else read_table(self.path, self.source)
        if self.predict:
            self._setup_predict(table)
            return
        validate(table, self.spec, Path(str(self.path)).name if self.path else "table")
        if self.max_rows and len(table) > self.max_rows:  # documented subsample (seeded)
            table = table.sample(n=self.max_rows, random_state=self.split_seed).sort_index()
        self.table = table.reset_index(drop=True)
        self.fields = text_fields(self.table, self.spec)
        self.targets = labels(self.table, self.spec)
        self.levels = self._levels_cfg or infer_levels(self.targets)
        self.folds = [] if self.test_all else grouped_folds(self.table, self.spec, self.n_folds, self.split_seed)
        self.use_fold(None if self.test_all else self.cv_fold)

    def _setup_predict(self, table: pd.DataFrame) -> None:
        """Every row is the predict split; label columns are optional (NaN targets when absent). The rows
        hold every field as the model reads it: a derived one (`previous_turns`) built already
        (`TextScorer.build_fields`, from the raw columns as training does), or empty when absent."""
        spec = self.spec
        needed = spec.text_columns + spec.context_columns + spec.persona_columns
        missing = [c for c in dict.fromkeys(needed) if c not in table.columns]
        if missing:
            raise ValueError(f"rows to score lack column(s) {missing}; they have {list(table.columns)}")
        if len(table) == 0:
            raise ValueError("no rows to score")
        self.table = table.reset_index(drop=True)
        self.fields = text_fields(self.table, replace(spec, context_turns=0))
        if spec.context_turns > 0:  # built by the caller (TextScorer.build_fields), or none
            given = self.table[PREVIOUS_TURNS] if PREVIOUS_TURNS in self.table.columns else pd.Series([""] * len(self.table))
            self.fields[PREVIOUS_TURNS] = given.fillna("").astype(str).tolist()
        self.targets = np.stack([pd.to_numeric(self.table[c], errors="coerce").to_numpy(np.float32)
                                 if c in self.table.columns else np.full(len(self.table), np.nan, np.float32)
                                 for c in spec.label_columns], axis=1)
        self.levels = self._levels_cfg
        self.folds, self.fold = [], None
        self.train_rows, self.val_rows = np.arange(0), np.arange(0)
        self.test_rows = np.arange(len(self.table))

    @classmethod
    def for_checkpoint(cls, data_cfg: dict[str, Any], fitted: dict[str, Any], rows: pd.DataFrame) -> "TextDataModule":
        """A predict split over `rows` with a checkpoint's data config and fitted state (its
        `data_info`: persona vocabulary, target statistics), set up and ready to predict."""
        keep = {k: v for k, v in data_cfg.items() if not k.startswith("_")}
        keep.update(path=None, table=rows, predict=True, cv_fold=None, test_all=False, max_rows=None, batch_size=64)
        datamodule = cls(**keep)
        datamodule.setup("predict")
        datamodule.apply_fitted(PersonaEncoder.from_state(fitted["persona"]), np.asarray(fitted["target_mean"]),
                                np.asarray(fitted["target_std"]))
        return datamodule

    def all_texts(self) -> list[str]:
        return [t for values in self.fields.values() for t in values]

    def use_fold(self, k: int | None) -> None:
        """Select fold k; None trains on every row (validation still held out) with no test rows,
        or, with test_all, tests every row."""
        self.fold = k
        if self.test_all:
            self.train_rows, self.val_rows = np.arange(0), np.arange(0)
            self.test_rows = np.arange(len(self.table))
            return
        train, test = (np.arange(len(self.table)), np.arange(0)) if k is None else self.folds[k]
        self.train_rows, self.val_rows = inner_validation_split(np.asarray(train), self.table, self.spec,
                                                                self.val_fraction, self.split_seed + (k or 0))
        self.test_rows = np.asarray(test)
        persona = PersonaEncoder(self.spec.persona_columns).fit(self.table.iloc[self.train_rows])
        train_targets = self.targets[self.train_rows]
        std = train_targets.std(0)
        self.apply_fitted(persona, train_targets.mean(0), np.where(std > 0, std, 1.0))

    def apply_fitted(self, persona: PersonaEncoder, target_mean: np.ndarray, target_std: np.ndarray) -> None:
        """Use a fitted persona encoder and target statistics (a fold's training rows, or a checkpoint's)."""
        self.persona = persona
        self.persona_ids, self.persona_numeric = persona.transform(self.table)
        self.target_mean = np.asarray(target_mean, dtype=np.float32)
        self.target_std = np.asarray(target_std, dtype=np.float32)

    @property
    def train_target_mean(self) -> np.ndarray:
        return self.target_mean

    def fitted_state(self) -> dict[str, Any]:
        """What a checkpoint keeps to score new text the way this fold was trained."""
        return {"fields": list(self.spec.fields), "labels": list(self.spec.label_columns),
                "persona": self.persona.state(), "target_mean": self.target_mean.tolist(),
                "target_std": self.target_std.tolist(), "levels": list(self.levels) if self.levels else None}

    def collate(self, rows: list[int]) -> dict:
        """Raw texts always (a fine-tuned encoder or a text branch reads them); with a frozen
        `embedder` attached also the cached embeddings, and for each of `layer_sets` (k) the fields'
        mean of the last k layers' pooled vectors (`layer_embeddings[k]`, rows x fields*dim)."""
        idx = np.asarray(rows, dtype=int)
        batch = {"persona_ids": torch.from_numpy(self.persona_ids[idx]),
                 "persona_numeric": torch.from_numpy(self.persona_numeric[idx]),
                 "target": torch.from_numpy(self.targets[idx]), "row": torch.from_numpy(idx),
                 "texts": {f: [values[i] for i in idx] for f, values in self.fields.items()}}
        if self.embedder is not None:
            matrix, layers = self._embedding_matrices()
            batch["embeddings"] = matrix[torch.from_numpy(idx)]
            if layers:
                batch["layer_embeddings"] = {k: x[torch.from_numpy(idx)] for k, x in layers.items()}
        return batch

    def _embedding_matrices(self) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Every row's concatenated field embeddings (rows x fields*dim) and, per layer set, its
        concatenated layer embeddings, built once from the encoder's caches."""
        owner = (self.embedder, tuple(self.layer_sets))
        if getattr(self, "_matrices", None) is None or self._matrices_owner != owner:
            matrix = torch.cat([self.embedder(self.fields[f]) for f in self.spec.fields], dim=-1).float()
            layers = {}
            if self.layer_sets:
                per_field = [self.embedder.layer_embeddings(self.fields[f], tuple(self.layer_sets)) for f in self.spec.fields]
                layers = {k: torch.from_numpy(np.concatenate([x[:, j] for x in per_field], axis=1))
                          for j, k in enumerate(self.layer_sets)}
            self._matrices, self._matrices_owner = (matrix, layers), owner
        return self._matrices

    def _loader(self, rows: np.ndarray, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.split_seed + (self.fold or 0))
        return DataLoader(_Rows(rows), batch_size=self.batch_size, shuffle=shuffle, collate_fn=self.collate,
                          generator=generator if shuffle else None, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_rows, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_rows, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_rows, False)

    def predict_dataloader(self) -> DataLoader:
        """Every row of a predict datamodule (predict=True); else the test rows."""
        return self._loader(self.test_rows, False)

    def scale(self) -> list[float] | None:
        """The label scale: the configured or inferred integer levels, else the labels' observed range."""
        if self.levels:
            return [float(self.levels[0]), float(self.levels[1])]
        finite = self.targets[np.isfinite(self.targets)]
        return [float(finite.min()), float(finite.max())] if finite.size else None

    def groups(self, rows: np.ndarray) -> list[str]:
        """The group (writer / conversation) of each row, or the row number without a group column."""
        column = self.spec.group_column
        return [str(v) for v in self.table[column].to_numpy()[rows]] if column else [str(r) for r in rows]

    def describe(self) -> dict:
        """What a checkpoint records about its data (the web app's model card shows name, rows, labels,
        scale and whether the table was generated)."""
        return {"name": self.name, "rows": len(self.table), "fields": self.spec.fields, "labels": self.spec.label_columns,
                "scale": self.scale(), "generated": self.generated,
                "group_column": self.spec.group_column, "persona_columns": self.spec.persona_columns,
                "cv_folds": self.n_folds, "cv_fold": self.fold, "levels": list(self.levels) if self.levels else None,
                "train_rows": len(self.train_rows), "val_rows": len(self.val_rows), "test_rows": len(self.test_rows)}
