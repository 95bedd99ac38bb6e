"""LightningDataModule over a text table with grouped K-fold cross-validation.

`setup()` reads and validates the table and computes the folds once; `use_fold(k)` selects fold k
(test = that fold, validation = a grouped `val_fraction` of the rest) and fits the persona encoder
and target statistics on its training rows only. Batches carry the raw strings of every field
(the encoder caches their embeddings when frozen), persona ids / numbers, targets and row indices.
"""
from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

from src.text.data import (PersonaEncoder, TextTableSpec, grouped_folds, inner_validation_split, labels, read_table,
                           text_fields, validate)
from src.text.metrics import infer_levels


class _Rows(Dataset):
    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> int:
        return int(self.rows[i])


class TextDataModule(L.LightningDataModule):
    """Any CSV / JSONL of texts with numeric labels; see src/text/data.py for the column roles."""

    def __init__(self, path: str, text_columns: list[str], label_columns: list[str], group_column: str | None = None,
                 context_columns: list[str] | None = None, persona_columns: list[str] | None = None,
                 order_column: str | None = None, context_turns: int = 0, n_folds: int = 5,
                 folds: list[int] | None = None, val_fraction: float = 0.1, batch_size: int = 64, split_seed: int = 0,
                 levels: list[int] | None = None, max_rows: int | None = None, name: str = "text",
                 table: pd.DataFrame | None = None):
        super().__init__()
        as_list = (lambda v: [v] if isinstance(v, str) else list(v or []))
        self.path = path
        self.name = name
        self.spec = TextTableSpec(as_list(text_columns), as_list(label_columns), group_column, as_list(context_columns),
                                  as_list(persona_columns), order_column, int(context_turns))
        self.n_folds, self.val_fraction, self.batch_size, self.split_seed = n_folds, val_fraction, batch_size, split_seed
        self.selected_folds = folds
        self.max_rows = max_rows
        self._levels_cfg = tuple(levels) if levels else None
        self.table = table
        self.fold: int | None = None
        self.embedder = None  # a frozen TextEncoder: batches then carry its cached embeddings

    def setup(self, stage: str | None = None) -> None:
        if getattr(self, "folds", None) is not None:
            return
        table = self.table if self.table is not None else read_table(self.path)
        validate(table, self.spec, Path(str(self.path)).name if self.path else "table")
        if self.max_rows and len(table) > self.max_rows:  # documented subsample (seeded)
            table = table.sample(n=self.max_rows, random_state=self.split_seed).sort_index()
        self.table = table.reset_index(drop=True)
        self.fields = text_fields(self.table, self.spec)
        self.targets = labels(self.table, self.spec)
        self.levels = self._levels_cfg or infer_levels(self.targets)
        self.folds = grouped_folds(self.table, self.spec, self.n_folds, self.split_seed)
        self.fold_ids = list(range(self.n_folds)) if self.selected_folds is None else list(self.selected_folds)
        bad = [k for k in self.fold_ids if not 0 <= k < self.n_folds]
        if bad:
            raise ValueError(f"folds {bad} outside 0..{self.n_folds - 1}")

    def all_texts(self) -> list[str]:
        return [t for values in self.fields.values() for t in values]

    def use_fold(self, k: int | None) -> None:
        """Select fold k; None trains on every row (validation still held out) with no test rows."""
        self.setup()
        self.fold = k
        if k is None:
            train, test = np.arange(len(self.table)), np.arange(0)
        else:
            train, test = self.folds[k]
        self.train_rows, self.val_rows = inner_validation_split(np.asarray(train), self.table, self.spec,
                                                                self.val_fraction, self.split_seed + (k or 0))
        self.test_rows = np.asarray(test)
        self.persona = PersonaEncoder(self.spec.persona_columns).fit(self.table.iloc[self.train_rows])
        self.persona_ids, self.persona_numeric = self.persona.transform(self.table)
        train_targets = self.targets[self.train_rows]
        self.target_mean = train_targets.mean(0)
        self.target_std = np.where(train_targets.std(0) > 0, train_targets.std(0), 1.0).astype(np.float32)

    def collate(self, rows: list[int]) -> dict:
        """With a frozen `embedder` set, batches carry cached embeddings instead of strings."""
        idx = np.asarray(rows)
        batch = {"persona_ids": torch.from_numpy(self.persona_ids[idx]),
                 "persona_numeric": torch.from_numpy(self.persona_numeric[idx]),
                 "target": torch.from_numpy(self.targets[idx]), "row": torch.from_numpy(idx)}
        if self.embedder is not None:
            batch["embeddings"] = self._embedding_matrix()[torch.from_numpy(idx)]
        else:
            batch["texts"] = {f: [values[i] for i in idx] for f, values in self.fields.items()}
        return batch

    def _embedding_matrix(self) -> torch.Tensor:
        """Every row's concatenated field embeddings (rows x fields*dim), built once from the encoder cache."""
        if getattr(self, "_matrix", None) is None or self._matrix_owner is not self.embedder:
            self._matrix = torch.cat([self.embedder(self.fields[f]) for f in self.spec.fields], dim=-1).float()
            self._matrix_owner = self.embedder
        return self._matrix

    def _loader(self, rows: np.ndarray, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.split_seed + (self.fold or 0))
        return DataLoader(_Rows(rows), batch_size=self.batch_size, shuffle=shuffle, collate_fn=self.collate,
                          generator=generator if shuffle else None)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_rows, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_rows, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_rows, False)

    def describe(self) -> dict:
        return {"rows": len(self.table), "fields": self.spec.fields, "labels": self.spec.label_columns,
                "group_column": self.spec.group_column, "persona_columns": self.spec.persona_columns,
                "n_folds": self.n_folds, "levels": self.levels}
