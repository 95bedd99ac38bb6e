"""Participant-grouped K-fold cross-validation, run as a sweep over folds and reported as mean ± std
over folds (`evaluate_sweep` does that with the paper tables).

With 41 participants a 10% test split holds about 4 people, so one split's numbers swing with who
those people are; K folds give every participant one test turn. Run it with

    python train.py -m experiment=demo data.cv_folds=5 'data.cv_fold=range(5)'
    python evaluate.py sweep_dir=logs/train/multiruns/<date>

The split of each fold comes from `empathic_fusion.datamodules.splits.participant_folds`.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd


def coverage(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (model, modality, seed): folds found, participants tested, and participants tested more than once.

    Reads each fold's test_predictions.csv; a correct K-fold run tests every participant exactly once.
    """
    folds = runs[runs["fold"].notna() & (runs["level"] == "rating")]
    if folds.empty:
        raise ValueError("no cross-validation runs (data.cv_folds > 1) among these runs")
    rows = []
    for (model, modality, seed), group in folds.groupby(["model", "modality", "seed"], sort=False):
        tested = pd.concat([pd.read_csv(Path(d) / "test_predictions.csv", usecols=["participant_id"])
                            .drop_duplicates().assign(fold=f) for d, f in zip(group["run_dir"], group["fold"])])
        counts = tested["participant_id"].value_counts()
        rows.append({"model": model, "modality": modality, "seed": seed, "folds": int(group["fold"].nunique()),
                     "participants_tested": int(len(counts)), "tested_twice_or_more": int((counts > 1).sum())})
    return pd.DataFrame(rows)


def out_of_fold_predictions(runs: pd.DataFrame) -> pd.DataFrame:
    """Every fold's rating-level test predictions stacked (one prediction per rating per model/modality/seed)."""
    folds = runs[runs["fold"].notna() & (runs["level"] == "rating")]
    parts = [pd.read_csv(Path(d) / "test_predictions.csv").assign(model=m, modality=mo, seed=s, fold=f)
             for d, m, mo, s, f in zip(folds["run_dir"], folds["model"], folds["modality"], folds["seed"], folds["fold"])]
    if not parts:
        raise ValueError("no cross-validation runs (data.cv_folds > 1) among these runs")
    return pd.concat(parts, ignore_index=True)
