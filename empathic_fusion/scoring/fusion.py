"""Score a folder of recordings with a fusion checkpoint, through the training data path.

The checkpoint's own data and feature config builds an `FusionDataModule` with its predict split over the new
dataset (ratings.csv optional): `prepare_data` validates the dataset and extracts what its store lacks,
`setup` builds the windows z-scored with the training statistics the checkpoint carries, and the one predict
loop (models/predict.py) runs the module's `predict_step` (the web app's Clip tab scores one clip the same
way). Predictions are mapped back onto the rating scale the model was trained on (the checkpoint carries it;
1-5 for checkpoints from before), never the new folder's: a folder whose ratings.csv rates on another scale is
refused. Every (session, story) pair the predict split holds comes back, scored or with the reason it could
not be, and so does every session without a pair to score (one row, story_id empty). Media shorter than one
window are scored as one window as in training (datamodules/windows.py), with a `note`; window times end at
the media's end.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
import torch

from empathic_fusion.datamodules.fusion_datamodule import FusionDataModule
from empathic_fusion.datamodules.windows import short_media_note, window_ends
from empathic_fusion.metrics import aggregate_by_rating
from empathic_fusion.evaluation.card import FUSION_OUTPUT, FUSION_WINDOW, ModelCard
from empathic_fusion.models.fusion_module import FusionModule
from empathic_fusion.models.predict import predict


def missing_statistics(model: FusionModule) -> list[str]:
    """The model's modalities that its data config z-scores but whose training statistics the checkpoint
    lacks (checkpoints written before they were recorded): such a checkpoint cannot score new data."""
    normalized = model.hparams.run_config["data"].get("normalize") or []
    return [m for m in model.modalities if m in normalized and m not in (model.normalization or {})]


def predict_datamodule(model: FusionModule, dataset_dir: Path, store_dir: Path, extract_workers: int = 1,
                       batch_size: int | None = None) -> FusionDataModule:
    """The checkpoint's data config over another dataset: its predict split, the checkpoint's statistics."""
    run_config = model.hparams.run_config
    missing = missing_statistics(model)
    if missing:
        raise ValueError(f"the checkpoint carries no training normalisation statistics for {missing} (checkpoints "
                         "written before they were recorded); retrain to score new data with it")
    data_cfg = {**run_config["data"], "dataset_dir": str(dataset_dir), "store_dir": str(store_dir), "demo": None,
                "extract_workers": int(extract_workers), "num_workers": 0,
                **({"batch_size": int(batch_size)} if batch_size else {})}
    build = hydra.utils.instantiate(data_cfg, _partial_=True, _convert_="all")
    return build(modalities=list(model.modalities), features=dict(run_config["features"]), predict=True,
                 stats=model.normalization)


@dataclass
class DatasetScores:
    """A dataset's predictions: one row per (session, story) pair, one per session, one per window."""

    pairs: pd.DataFrame
    sessions: pd.DataFrame
    windows: pd.DataFrame

    @property
    def scored(self) -> int:
        return int((self.pairs.status == "scored").sum())


def score_dataset(model: FusionModule, card: ModelCard, dataset_dir: Path, store_dir: Path,
                  accelerator: str = "cpu", extract_workers: int = 1, batch_size: int | None = None,
                  progress: bool = True) -> DatasetScores:
    """Extract what is missing, then predict every (session, story) pair of the dataset. Raises
    DatasetError (file, line, field) for a dataset that breaks the contract."""
    datamodule = predict_datamodule(model, dataset_dir, store_dir, extract_workers, batch_size)
    datamodule.prepare_data()
    failures = list(datamodule.extraction_report.failures)
    try:
        datamodule.setup("predict")
    except RuntimeError:
        ratings = datamodule.ratings
        if not len(ratings) or len(datamodule.skipped) != len(ratings):
            raise
        return _tables(datamodule, model, card, None, None, failures)  # not one window: every pair with its reason
    if len(datamodule.dataset.ratings):  # self-reports listed beside the predictions: both on one scale
        model.check_rating_scale(datamodule.dataset)
    pred = predict(model, datamodule, accelerator, progress, unit="window").numpy()
    return _tables(datamodule, model, card, datamodule.datasets["predict"].windows, pred, failures)


def rating_means(pred: np.ndarray, rating_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Window predictions averaged per rating, and those ratings' indices. Arrays pandas hands out are
    read-only (copy-on-write), which torch.from_numpy warns about, so a read-only one is copied first."""
    means, _, ids = aggregate_by_rating(torch.from_numpy(np.require(pred, requirements="W")), torch.zeros(len(pred)),
                                        torch.from_numpy(np.require(rating_index, requirements="W")))
    return means.numpy(), ids.numpy()


def _clipped(card: ModelCard, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scores clipped to the card's label scale, and which raw scores were outside it."""
    values = [card.clip(float(v)) for v in raw]
    return np.array([v for v, _ in values], dtype=float), np.array([o for _, o in values], dtype=bool)


def _tables(datamodule: FusionDataModule, model: FusionModule, card: ModelCard, windows: pd.DataFrame | None,
            pred: np.ndarray | None, failures: list[dict]) -> DatasetScores:
    ratings = datamodule.ratings
    masked = _masked_modalities(datamodule)
    pairs = pd.DataFrame({"session_id": ratings.session_id.to_numpy(), "participant_id": ratings.participant_id.to_numpy(),
                          "story_id": ratings.story_id.to_numpy(), "scenario": datamodule.scenario})
    pairs["predicted"] = np.nan
    pairs["raw_predicted"] = np.nan
    pairs["clipped"] = False
    pairs["interval_low"] = np.nan
    pairs["interval_high"] = np.nan
    pairs["windows"] = 0
    pairs["masked_modalities"] = [masked.get(sid, "") for sid in pairs.session_id]
    pairs["self_report"] = pd.to_numeric(ratings.empathy, errors="coerce").to_numpy()
    pairs["status"] = "not scored"
    pairs["reason"] = [datamodule.skipped.get(int(i), "") for i in ratings.index]
    pairs["note"] = [_short_note(datamodule, sid) for sid in pairs.session_id]
    window_rows = pd.DataFrame(columns=["session_id", "participant_id", "story_id", "start_s", "end_s",
                                        "predicted", "raw_predicted", "interval_low", "interval_high"])
    if windows is not None and pred is not None:
        index = windows.rating_index.to_numpy(dtype=np.int64)
        means, ids = rating_means(pred, index)
        rows = ratings.index.get_indexer(ids)  # positions of the scored ratings in `pairs`
        raw = np.asarray(model.rating_scale.to_rating(means), dtype=float)
        value, outside = _clipped(card, raw)
        pairs.loc[rows, "predicted"], pairs.loc[rows, "raw_predicted"], pairs.loc[rows, "clipped"] = value, raw, outside
        pairs.loc[rows, "status"], pairs.loc[rows, "reason"] = "scored", ""
        pairs.loc[rows, "windows"] = windows.rating_index.value_counts().reindex(ids).to_numpy()
        bounds = card.interval_bounds(FUSION_OUTPUT, value)  # the rating-level conformal interval
        if bounds is not None:
            pairs.loc[rows, "interval_low"], pairs.loc[rows, "interval_high"] = bounds
        raw_windows = np.asarray(model.rating_scale.to_rating(pred), dtype=float)
        rated = ratings.loc[index]
        fps = datamodule.dataset.fps
        starts = windows.start.to_numpy()
        ends = window_ends(starts, windows.session_id.map(datamodule.session_frames).to_numpy(), datamodule.window_frames)
        window_rows = pd.DataFrame({"session_id": windows.session_id.to_numpy(),
                                    "participant_id": rated.participant_id.to_numpy(),
                                    "story_id": rated.story_id.to_numpy(),
                                    "start_s": starts / fps, "end_s": ends / fps,  # never past the media's end
                                    "predicted": _clipped(card, raw_windows)[0], "raw_predicted": raw_windows,
                                    "interval_low": np.nan, "interval_high": np.nan})
        window_bounds = card.interval_bounds(FUSION_WINDOW, window_rows["predicted"].to_numpy())  # window level
        if window_bounds is not None:
            window_rows["interval_low"], window_rows["interval_high"] = window_bounds
    sessions = _session_table(datamodule, pairs, masked, failures)
    return DatasetScores(_with_sessions_without_pairs(pairs, sessions, datamodule.scenario), sessions, window_rows)


def _short_note(datamodule: FusionDataModule, session_id: str) -> str:
    """The note of a session whose media are shorter than one window (windows.py's one rule), else ""."""
    n_frames = datamodule.session_frames.get(session_id)
    if n_frames is None or datamodule.dataset is None:
        return ""
    return short_media_note(n_frames, datamodule.window_frames, datamodule.dataset.fps) or ""


def _with_sessions_without_pairs(pairs: pd.DataFrame, sessions: pd.DataFrame, scenario: str) -> pd.DataFrame:
    """The pairs, then a row (story_id empty, not scored, with its reason) for every session that has no pair
    to score (no transcript, so its stories are unknown): predictions.csv lists every session."""
    lone = sessions[sessions.stories_scored + sessions.stories_not_scored == 0]
    if lone.empty:
        return pairs
    rows = pd.DataFrame({"session_id": lone.session_id.to_numpy(), "participant_id": lone.participant_id.to_numpy(),
                         "story_id": "", "scenario": scenario, "clipped": False, "windows": 0,
                         "masked_modalities": lone.masked_modalities.to_numpy(), "status": "not scored",
                         "reason": lone.reason.to_numpy(), "note": ""})
    return pd.concat([pairs, rows], ignore_index=True)[list(pairs.columns)]


def _masked_modalities(datamodule: FusionDataModule) -> dict[str, str]:
    """Per session, the modalities (or branches) its windows read as masked: missing, failed or stale."""
    masked: dict[str, list[str]] = {}
    for item in sorted(datamodule.missing, key=lambda t: tuple(map(str, t))):
        name = item[1] if len(item) == 2 else f"{item[1]}:{item[2]}"
        if len(item) == 3 and (item[0], item[1]) in datamodule.missing:
            continue  # the whole modality is masked: named once
        masked.setdefault(item[0], []).append(name)
    return {sid: "+".join(names) for sid, names in masked.items()}


def _session_table(datamodule: FusionDataModule, pairs: pd.DataFrame, masked: dict[str, str],
                   failures: list[dict]) -> pd.DataFrame:
    """One row per session of sessions.csv: its pairs scored and not, the mean prediction, and why a
    session with nothing scored has nothing (its pairs' reasons, its extraction failures)."""
    failed: dict[str, list[str]] = {}
    for failure in failures:
        failed.setdefault(failure["session_id"], []).append(f"{failure['branch']}: {failure['error']}")
    by_session = dict(tuple(pairs.groupby("session_id", sort=False)))
    rows: list[dict[str, Any]] = []
    for sid, session in datamodule.dataset.sessions.iterrows():
        own = by_session.get(sid, pairs.iloc[:0])
        scored = own[own.status == "scored"]
        reasons = list(dict.fromkeys(r for r in own.reason if r))
        rows.append({"session_id": sid, "participant_id": session.participant_id,
                     "stories_scored": len(scored), "stories_not_scored": len(own) - len(scored),
                     "mean_predicted": float(scored.predicted.mean()) if len(scored) else np.nan,
                     "masked_modalities": masked.get(sid, ""),
                     "extraction_failures": "; ".join(failed.get(sid, [])),
                     "reason": "" if len(scored) else "; ".join(reasons) or _no_pair_reason(datamodule, sid)})
    return pd.DataFrame(rows)


def _no_pair_reason(datamodule: FusionDataModule, session_id: str) -> str:
    if session_id not in datamodule.dataset.transcripts:
        return f"no transcript (transcripts/{session_id}.csv is missing), so its phases and stories are unknown"
    return "no (session, story) pair to score"
