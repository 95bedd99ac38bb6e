"""Normalisation statistics: per-feature mean and std of each branch over the valid frames that the
training windows cover (audio only where the participant speaks), so z-scoring never sees validation
or test frames. Indexed branches (GloVe words) are stored pre-scaled and get mean 0, std 1."""
from __future__ import annotations

import numpy as np
import pandas as pd

from empathic_fusion.core.branches import INDEXED
from empathic_fusion.datamodules.window_dataset import CHUNK_ROWS
from empathic_fusion.features.store import FeatureStore

Stats = tuple[np.ndarray, np.ndarray]


def normalisation_stats(store: FeatureStore, windows: pd.DataFrame, branches: dict[str, list[str]],
                        branch_dims: dict[str, int], window_frames: int, speaking: dict[str, np.ndarray],
                        missing: set) -> dict[str, Stats]:
    """Mean and std per modality in `branches` (its branches' features side by side). A modality with a
    branch that no training window can read gets no statistics (it is left unnormalised).
    `missing` holds the masked (session, modality) and (session, modality, branch)."""
    stats = {}
    for modality, names in branches.items():
        parts = [branch_stats(store, modality, branch, windows, branch_dims[branch], window_frames, speaking,
                              missing) for branch in names]
        if all(part is not None for part in parts):
            stats[modality] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return stats


def branch_stats(store: FeatureStore, modality: str, branch: str, windows: pd.DataFrame, dim: int,
                 window_frames: int, speaking: dict[str, np.ndarray], missing: set) -> Stats | None:
    """Mean and std of one branch over its valid frames in training windows (None: no such frame)."""
    if branch in INDEXED:
        return np.zeros(dim, dtype=np.float32), np.ones(dim, dtype=np.float32)
    total = total_sq = None
    count = 0
    for sid, group in windows.groupby("session_id"):
        if (sid, modality) in missing or (sid, modality, branch) in missing:
            continue
        frames = len(store.load(sid, branch, "features"))
        covered = np.zeros(frames, dtype=bool)
        for start in group.start:
            covered[max(start, 0): start + window_frames] = True
        covered &= store.load(sid, branch, "mask") > 0
        if modality == "audio":
            covered &= speaking[sid][: len(covered)]
        session = covered_sums(store, sid, branch, covered)
        if session is None:
            continue
        total = session[0] if total is None else total + session[0]
        total_sq = session[1] if total_sq is None else total_sq + session[1]
        count += session[2]
    if not count:
        return None
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - mean ** 2, 0.0))
    return mean.astype(np.float32), np.where(std < 1e-6, 1.0, std).astype(np.float32)


def covered_sums(store: FeatureStore, sid: str, branch: str, covered: np.ndarray,
                  chunk_rows: int = CHUNK_ROWS) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Sum and sum of squares (float64) of a session's covered frames, read a chunk of rows at a time so
    memory does not grow with the session's length. Each chunk's rows are added after the running sums,
    in frame order, so the result equals one sum over all of them (NumPy adds along axis 0 row by row)."""
    total = total_sq = None
    count = 0
    for lo in range(0, len(covered), chunk_rows):
        rows = covered[lo: lo + chunk_rows]
        if not rows.any():
            continue
        values = np.asarray(store.load(sid, branch, "features")[lo: lo + chunk_rows][rows], dtype=np.float64)
        store.check_finite(values, sid, branch, "features")
        squares = values ** 2
        total = values.sum(0) if total is None else np.vstack([total[None], values]).sum(0)
        total_sq = squares.sum(0) if total_sq is None else np.vstack([total_sq[None], squares]).sum(0)
        count += len(values)
    return None if total is None else (total, total_sq, count)
