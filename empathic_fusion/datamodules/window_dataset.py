"""A torch Dataset of context windows read from memory-mapped store arrays.

Each item is the batch-dict contract every model consumes:
    {"video"|"audio"|"text": {"x": (k, F) float32, "mask": (k,) bool, "lengths": () long},
     "story": (D,) story embedding, "traits": (P,) standardised survey traits, "traits_mask": (P,),
     "target": () rating on the cosine scale (rating - midpoint) / half-range of the dataset's rating
               scale ((rating - 3) / 2 on the default 1-5), "rating_index": () long}
Only the selected modalities' arrays are opened. A modality's x is its store branches' per-frame
vectors concatenated in the configured order (e.g. video = face 1451 + cnn 1280; see
empathic_fusion/core/branches.py); each branch is z-scored with its own training statistics and zeroed where
its own mask is 0, and the modality's mask is 1 where any of its branches is valid. Frames outside
the session, without a face (and no CNN embedding), or (audio) without participant speech have
mask 0 and zero features.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from empathic_fusion.dataset.scale import TRAIT_SCALE, RatingScale
from empathic_fusion.core.branches import INDEXED
from empathic_fusion.features.store import FeatureStore

CHUNK_ROWS = 8192  # frames read (and z-scored) at a time when a whole session is read: bounds memory, whatever its length


def window_labels(windows: pd.DataFrame, ratings: pd.DataFrame, story_rows: dict[str, int],
                  traits: pd.DataFrame, scale: RatingScale) -> tuple[np.ndarray, ...]:
    """Per window: target (float32, the rating on `scale` mapped onto [-1, 1]), rating, the row of its
    story's embedding (int64: a window holds the row, not the embedding, so labels stay a few bytes a
    window), standardised traits and their mask."""
    rated = ratings.loc[windows.rating_index]
    targets = scale.to_target(rated.empathy.to_numpy()).astype(np.float32)
    story = np.array([story_rows[s] for s in rated.story_id], dtype=np.int64)
    trait_values = traits.loc[rated.participant_id].to_numpy(dtype=np.float64)
    trait_mask = np.isfinite(trait_values)
    return targets, rated.empathy.to_numpy(), story, np.nan_to_num(TRAIT_SCALE.to_target(trait_values)).astype(np.float32), trait_mask


@dataclass(frozen=True)
class FrameSource:
    """What windows read from the store, for every loader (WindowDataset, the batched FrameArrays, the
    app): per modality its branches in column order and their widths, each session's length on the
    dataset clock, where the participant speaks (the audio mask), the training statistics that z-score
    each modality, and the masked (session, modality) and (session, modality, branch)."""

    store: FeatureStore
    branches: dict[str, list[str]]
    branch_dims: dict[str, int]
    session_frames: dict[str, int]
    speaking: dict[str, np.ndarray]
    stats: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    missing: frozenset | set = frozenset()

    @property
    def modalities(self) -> list[str]:
        return list(self.branches)

    @property
    def dims(self) -> dict[str, int]:
        """Per modality, the width of x (its branches side by side)."""
        return {m: sum(self.branch_dims[b] for b in names) for m, names in self.branches.items()}


class WindowDataset(Dataset):
    """The per-window reference loader: window i of `windows` read from `source` (see the module doc)."""

    def __init__(self, source: FrameSource, windows: pd.DataFrame, ratings: pd.DataFrame, length: int,
                 story_embeddings: np.ndarray, story_rows: dict[str, int], traits: pd.DataFrame, scale: RatingScale):
        self.store = source.store
        self.windows = windows.reset_index(drop=True)
        self.modalities = source.modalities
        self.length = length
        self.session_frames = source.session_frames
        self.speaking = source.speaking
        self.stats = source.stats
        self.missing = source.missing  # (session, modality) or (session, modality, branch) that failed: masked
        self.branches = source.branches
        self.branch_dims = source.branch_dims
        labels = window_labels(self.windows, ratings, story_rows, traits, scale)
        self.targets, self.ratings, self.story_row, self.traits, self.traits_mask = labels
        self.story_embeddings = np.asarray(story_embeddings, dtype=np.float32)
        self._arrays: dict[tuple[str, str, str], np.ndarray] = {}
        self.dims = source.dims

    def __len__(self) -> int:
        return len(self.windows)

    def _array(self, session_id: str, branch: str, name: str) -> np.ndarray:
        key = (session_id, branch, name)
        if key not in self._arrays:
            self._arrays[key] = self.store.load(session_id, branch, name)
        return self._arrays[key]

    def _slice(self, array: np.ndarray, start: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """array[start:start+k] padded with zeros, rows at or past `limit` (the media's end) left out; a
        bool vector of which rows came from the array."""
        stop = min(start + self.length, len(array), len(array) if limit is None else limit)
        out = np.zeros((self.length,) + array.shape[1:], dtype=array.dtype)
        inside = np.zeros(self.length, dtype=bool)
        if stop > start:
            out[: stop - start] = array[start:stop]
            inside[: stop - start] = True
        return out, inside

    def _branch(self, session_id: str, modality: str, branch: str, start: int,
                dim: int) -> tuple[np.ndarray, np.ndarray]:
        """One branch's (k, F) float32 rows and its (k,) validity for the window starting at `start`."""
        if (session_id, modality, branch) in self.missing:
            return np.zeros((self.length, dim), dtype=np.float32), np.zeros(self.length, dtype=bool)
        if branch in INDEXED:
            table_name, index_name = INDEXED[branch]
            index, inside = self._slice(self._array(session_id, branch, index_name), start,
                                        self.session_frames[session_id])
            mask = inside & (index >= 0)
            table = self._array(session_id, branch, table_name)
            x = np.zeros((self.length, table.shape[1]), dtype=np.float32)
            x[mask] = table[index[mask]]
            return x, mask
        features, inside = self._slice(self._array(session_id, branch, "features"), start)
        valid, _ = self._slice(self._array(session_id, branch, "mask"), start)
        self.store.check_finite(features, session_id, branch, "features",
                                f" in frames {start}-{start + self.length - 1}")
        return features.astype(np.float32), inside & (valid > 0)

    def _modality(self, modality: str, session_id: str, start: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
        if (session_id, modality) in self.missing:
            return np.zeros((self.length, dim), dtype=np.float32), np.zeros(self.length, dtype=bool)
        names = self.branches[modality]
        parts = [self._branch(session_id, modality, b, start, self.branch_dims[b]) for b in names]
        x = np.concatenate([p[0] for p in parts], axis=1) if len(parts) > 1 else parts[0][0]
        mask = np.logical_or.reduce([p[1] for p in parts])
        if modality == "audio":
            speaking, _ = self._slice(self.speaking[session_id], start)
            mask &= speaking
        if modality in self.stats:
            mean, std = self.stats[modality]
            x = (x - mean) / std
        offset = 0
        for part_x, part_mask in parts:  # each branch is zero where it has nothing, even if another has
            x[~part_mask, offset:offset + part_x.shape[1]] = 0.0
            offset += part_x.shape[1]
        x[~mask] = 0.0
        return x, mask

    def __getitem__(self, i: int) -> dict:
        window = self.windows.iloc[i]
        sid, start = window.session_id, int(window.start)
        item: dict = {}
        length = max(0, min(self.length, self.session_frames[sid] - start))
        for modality in self.modalities:
            x, mask = self._modality(modality, sid, start, self.dims[modality])
            item[modality] = {"x": torch.from_numpy(x), "mask": torch.from_numpy(mask),
                              "lengths": torch.tensor(length, dtype=torch.long)}
        item["story"] = torch.from_numpy(self.story_embeddings[self.story_row[i]])
        item["traits"] = torch.from_numpy(self.traits[i])
        item["traits_mask"] = torch.from_numpy(self.traits_mask[i])
        item["target"] = torch.tensor(self.targets[i])
        item["rating_index"] = torch.tensor(int(window.rating_index), dtype=torch.long)
        return item
