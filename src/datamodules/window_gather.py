"""Windows gathered a batch at a time from frame arrays: the datamodule's default loader.

`WindowDataset` builds each window in Python (a pandas row, NumPy slices, per-window z-scoring).
Here every store branch of the selected modalities is read once (through `FeatureStore.load`, so its
checks apply) and concatenated across sessions into one frame array, with one zero row at the end
that every frame outside a session or of a missing branch points to. A window is then, per branch,
an offset into that array and a count of in-session frames; a batch is one `index_select` per
branch, z-scored with the training statistics and masked as tensor ops on the arrays' device.
Windows overlap (120 frames, 1 s stride: about 8-fold), so the arrays cost about 1/8 of the
materialised windows.

Outputs are identical to `WindowDataset` (tests/test_window_gather.py): same keys, dtypes, values.
`FrameArrays.place` puts the arrays on the training device when they fit its memory budget (batches
are then gathered there, in the main process); otherwise they stay in host memory, batches are
gathered on the host and the DataLoader hands them over pinned.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler

from src.datamodules.window_dataset import window_labels
from src.features.branches import INDEXED
from src.features.store import FeatureStore

log = logging.getLogger(__name__)


class FrameArrays:
    """Every session's frames of the selected branches, concatenated per branch (store dtypes kept).

    `offsets[branch][sid]` is the session's first row, `frames[branch][sid]` its row count; sessions
    whose branch failed (`missing`) have neither. Indexed branches (a row table + a per-frame index)
    keep their table, with each session's index shifted onto the concatenated table.
    """

    def __init__(self, store: FeatureStore, session_frames: dict[str, int], branches: dict[str, list[str]],
                 missing: set, speaking: dict[str, np.ndarray] | None = None):
        self.branches = {m: list(b) for m, b in branches.items()}
        self.tensors: dict[str, torch.Tensor] = {}  # "<branch>/<array>" -> (rows + 1, ...) with a zero last row
        self.offsets: dict[str, dict[str, int]] = {}
        self.frames: dict[str, dict[str, int]] = {}
        for modality, names in self.branches.items():
            for branch in names:
                sessions = [s for s in session_frames
                            if (s, modality) not in missing and (s, modality, branch) not in missing]
                self._concatenate(store, branch, sessions)
        if speaking is not None and "audio" in self.branches:
            parts = [np.asarray(speaking[s], dtype=bool) for s in session_frames]
            self._add("speaking", "", list(session_frames), parts, {"speaking": parts})

    def _concatenate(self, store: FeatureStore, branch: str, sessions: list[str]) -> None:
        if branch in INDEXED:
            table_name, index_name = INDEXED[branch]
            tables, indices, row = [], [], 0
            for sid in sessions:
                table = np.asarray(store.load(sid, branch, table_name))
                index = np.asarray(store.load(sid, branch, index_name)).astype(np.int64)
                if index.size and index.max() >= len(table):
                    raise ValueError(f"session '{sid}', branch '{branch}': {index_name} points at row "
                                     f"{int(index.max())} of a {len(table)}-row {table_name} table")
                indices.append(np.where(index >= 0, index + row, -1))
                tables.append(table)
                row += len(table)
            self._add(branch, index_name, sessions, indices, {index_name: indices}, pad=-1)
            self._stack(f"{branch}/{table_name}", tables)
            return
        features, masks = [], []
        for sid in sessions:
            values = store.load(sid, branch, "features")
            valid = np.asarray(store.load(sid, branch, "mask")) > 0
            # rows past the end of a shorter mask are invalid, as in WindowDataset
            padded = np.zeros(len(values), dtype=bool)
            padded[: min(len(values), len(valid))] = valid[: len(values)]
            features.append(values)
            masks.append(padded)
        self._add(branch, "features", sessions, features, {"features": features, "mask": masks})

    def _add(self, branch: str, length_of: str, sessions: list[str], sized: list[np.ndarray],
             arrays: dict[str, list[np.ndarray]], pad: int = 0) -> None:
        self.offsets[branch], self.frames[branch], row = {}, {}, 0
        for sid, array in zip(sessions, sized):
            self.offsets[branch][sid], self.frames[branch][sid] = row, len(array)
            row += len(array)
        for name, parts in arrays.items():
            self._stack(f"{branch}/{name}" if length_of else branch, parts, pad)

    def _stack(self, key: str, parts: list[np.ndarray], pad: int = 0) -> None:
        """Concatenate (copying out of the memory maps) and append the padding row."""
        if not parts:
            raise ValueError(f"no session has {key}")
        last = np.full((1,) + parts[0].shape[1:], pad, dtype=parts[0].dtype)
        self.tensors[key] = torch.from_numpy(np.concatenate([*parts, last]))

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def place(self, device: torch.device | str, budget_bytes: float) -> torch.device:
        """Move the arrays to `device` when they fit `budget_bytes` there; else keep them on the host."""
        device = torch.device(device)
        size = self.nbytes()
        target = device if device.type == "cpu" or size <= budget_bytes else torch.device("cpu")
        if target != device:
            log.info("frame arrays (%.2f GB) exceed the %.2f GB device budget: gathering batches on the host",
                     size / 1e9, budget_bytes / 1e9)
        self.tensors = {k: t.to(target) for k, t in self.tensors.items()}
        return target


class WindowBatches(Dataset):
    """One split's windows; `data[indices]` is a whole batch in the batch-dict contract, `data[i]` one window.

    Keeps `WindowDataset`'s attributes (`windows`, `ratings`, `targets`, `story`, `traits`, `traits_mask`).
    """

    def __init__(self, frames: FrameArrays, windows: pd.DataFrame, ratings: pd.DataFrame, length: int,
                 session_frames: dict[str, int], story_embeddings: np.ndarray, story_rows: dict[str, int],
                 traits: pd.DataFrame, stats: dict[str, tuple[np.ndarray, np.ndarray]], branch_dims: dict[str, int]):
        self.arrays = frames
        self.windows = windows.reset_index(drop=True)
        self.length = int(length)
        self.modalities = list(frames.branches)
        self.branch_dims = dict(branch_dims)
        labels = window_labels(self.windows, ratings, story_embeddings, story_rows, traits)
        self.targets, self.ratings, self.story, self.traits, self.traits_mask = labels
        sessions = self.windows.session_id.to_numpy()
        starts = self.windows.start.to_numpy(dtype=np.int64)
        if (starts < 0).any():
            raise ValueError(f"window starts must be >= 0, got {int(starts.min())}")
        total = np.array([session_frames[s] for s in sessions], dtype=np.int64)
        self.index = {"lengths": torch.from_numpy(np.clip(total - starts, 0, self.length)),
                      "rating_index": torch.tensor(self.windows.rating_index.to_numpy(dtype=np.int64)),
                      "story": torch.from_numpy(self.story), "traits": torch.from_numpy(self.traits),
                      "traits_mask": torch.from_numpy(self.traits_mask), "target": torch.from_numpy(self.targets)}
        for branch in frames.offsets:  # per window: first row in the branch's array, rows inside the session
            pad_row = len(frames.tensors[self._rows_key(branch)]) - 1
            first = np.array([frames.offsets[branch].get(s, pad_row) for s in sessions], dtype=np.int64)
            count = np.array([frames.frames[branch].get(s, 0) for s in sessions], dtype=np.int64)
            inside = np.clip(count - starts, 0, self.length)
            self.index[f"{branch}/first"] = torch.from_numpy(np.where(inside > 0, first + starts, pad_row))
            self.index[f"{branch}/inside"] = torch.from_numpy(inside)
        self.stats = {m: tuple(torch.from_numpy(np.asarray(v, dtype=np.float32)) for v in stats[m]) for m in stats}
        self._device = torch.device("cpu")

    def _rows_key(self, branch: str) -> str:
        if branch == "speaking":
            return "speaking"
        return f"{branch}/{INDEXED[branch][1]}" if branch in INDEXED else f"{branch}/features"

    def to(self, device: torch.device) -> WindowBatches:
        """Per-window offsets, labels and statistics onto the arrays' device."""
        self._device = torch.device(device)
        self.index = {k: v.to(device) for k, v in self.index.items()}
        self.stats = {m: tuple(v.to(device) for v in pair) for m, pair in self.stats.items()}
        return self

    def __len__(self) -> int:
        return len(self.windows)

    def _rows(self, branch: str, window: torch.Tensor, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B*k,) row positions in the branch's array (the padding row outside the session) and (B, k) inside."""
        inside = frame[None, :] < self.index[f"{branch}/inside"][window][:, None]
        first = self.index[f"{branch}/first"][window][:, None]
        pad = len(self.arrays.tensors[self._rows_key(branch)]) - 1
        return torch.where(inside, first + frame[None, :], pad).reshape(-1), inside

    def _branch(self, branch: str, window: torch.Tensor, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, k, F) float32 rows and (B, k) validity of one branch."""
        tensors = self.arrays.tensors
        rows, inside = self._rows(branch, window, frame)
        shape = inside.shape
        if branch in INDEXED:
            table_name, index_name = INDEXED[branch]
            row = tensors[f"{branch}/{index_name}"].index_select(0, rows)
            valid = inside & (row >= 0).view(shape)
            table = tensors[f"{branch}/{table_name}"]
            row = torch.where(row >= 0, row, len(table) - 1)
            x = table.index_select(0, row).view(*shape, -1)
        else:
            x = tensors[f"{branch}/features"].index_select(0, rows).view(*shape, -1)
            valid = inside & tensors[f"{branch}/mask"].index_select(0, rows).view(shape)
        return x.to(torch.float32), valid

    def _modality(self, modality: str, window: torch.Tensor, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [self._branch(b, window, frame) for b in self.arrays.branches[modality]]
        mask = parts[0][1].clone()
        for _, valid in parts[1:]:
            mask |= valid
        if modality == "audio":
            rows, inside = self._rows("speaking", window, frame)
            mask &= inside & self.arrays.tensors["speaking"].index_select(0, rows).view(inside.shape)
        mean, std = self.stats.get(modality, (None, None))
        xs, column = [], 0
        for x, valid in parts:
            width = x.shape[-1]
            if mean is not None:  # fresh float32 unless the store is float32 already
                x = (x - mean[column:column + width]) / std[column:column + width]
            xs.append(x.masked_fill_(~(valid & mask)[..., None], 0.0))
            column += width
        return (torch.cat(xs, dim=-1) if len(xs) > 1 else xs[0]), mask

    def batch(self, window: torch.Tensor) -> dict:
        """The batch of windows `window` (a (B,) long tensor of positions in this split)."""
        window = window.to(self._device)
        frame = torch.arange(self.length, device=self._device)
        lengths = self.index["lengths"][window]
        batch: dict = {}
        for modality in self.modalities:
            x, mask = self._modality(modality, window, frame)
            batch[modality] = {"x": x, "mask": mask, "lengths": lengths}
        for key in ("story", "traits", "traits_mask", "target", "rating_index"):
            batch[key] = self.index[key][window]
        return batch

    def __getitem__(self, i: int | Sequence[int] | torch.Tensor) -> dict:
        if isinstance(i, (int, np.integer)):
            item = self.batch(torch.tensor([int(i)]))
            return {k: ({kk: vv[0] for kk, vv in v.items()} if isinstance(v, dict) else v[0]) for k, v in item.items()}
        return self.batch(torch.as_tensor(i, dtype=torch.long))

    def __getitems__(self, indices: list[int]) -> dict:
        return self.batch(torch.as_tensor(indices, dtype=torch.long))


class IndexBatchSampler(DistributedSampler):
    """Batches of window positions from any index sampler (the rating oversampler, or a
    `DistributedSampler` over the split), for a DataLoader with `batch_size=None`.

    A `DistributedSampler` itself so Lightning leaves it in place under DDP (sharding is the inner
    sampler's); `set_epoch` reaches the inner sampler.
    """

    def __init__(self, windows: Sampler[int], batch_size: int, drop_last: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.windows = windows
        self.batch_size = int(batch_size)
        self.drop_last = drop_last
        self.num_replicas = getattr(windows, "num_replicas", 1)
        self.rank = getattr(windows, "rank", 0)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.windows, "set_epoch"):
            self.windows.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        order = list(self.windows)
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        for begin in range(0, stop, self.batch_size):
            yield order[begin: begin + self.batch_size]

    def __len__(self) -> int:
        n = len(self.windows)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
