"""Windows gathered a batch at a time from frame arrays: the datamodule's default loader.

`WindowDataset` builds each window in Python (a pandas row, NumPy slices, per-window z-scoring).
Here every store branch of the selected modalities is read once (through `FeatureStore.load`, so its
checks apply) into one float32 frame array per modality, concatenated across sessions on the
session's frame clock (`session_frames` rows each) with one zero row at the end for frames outside a
session. z-scoring with the training statistics and masking depend only on the frame, so they are
done once here (in float32, the reference's arithmetic) instead of once per window: a frame is zero
where its branch has nothing or the modality's mask is 0 (no branch valid; audio: participant
silent). A window is then an offset and a count of in-session frames; a batch is one `index_select`
per modality (plus one per indexed branch, whose row tables are kept and whose per-frame index is
set to -1 where the modality is masked). Windows overlap about 8-fold, so the arrays cost about 1/8
of the materialised windows, in float32 twice the store's float16.

Outputs are identical to `WindowDataset` (tests/test_window_gather.py): same keys, dtypes, values.
`FrameArrays.place` puts the arrays on the training device when they fit its memory budget (batches
are then gathered there, in the main process); otherwise they stay in host memory, batches are
gathered on the host and the DataLoader hands them over pinned.

On the host, a batch's large outputs (tens of MB) are written into reused buffers (`HostBuffers`):
a fresh allocation of that size is a new memory mapping whose first touch page-faults every 4 KiB,
which cost about 7 times the gather itself (benchmarks/grid.py). A buffer is reused only when no
tensor outside the pool still shares its storage, so a batch that is kept is never overwritten.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset, DistributedSampler, Sampler, get_worker_info

from empathic_fusion.datamodules.window_dataset import FrameSource, window_labels
from empathic_fusion.core.branches import INDEXED

log = logging.getLogger(__name__)


def _fit(array: np.ndarray, n: int, fill) -> np.ndarray:
    """array cut or padded (with `fill`) to n rows."""
    out = np.full((n,) + array.shape[1:], fill, dtype=array.dtype)
    out[: min(n, len(array))] = array[:n]
    return out


class FrameArrays:
    """Per modality: normalised, masked float32 frames of every session, concatenated (+ a zero row).

    `offsets[sid]` is a session's first row; it has `session_frames[sid]` rows in every modality.
    `pieces[modality]` lists the modality's columns in branch order: ("dense", key) for runs of dense
    branches (one array), ("indexed", branch) for an indexed branch (`<branch>/index` shifted onto the
    concatenated `<branch>/table`, -1 = nothing).
    """

    def __init__(self, source: FrameSource):
        self.branches = {m: list(b) for m, b in source.branches.items()}
        self.offsets, row = {}, 0
        for sid, n in source.session_frames.items():
            self.offsets[sid] = row
            row += int(n)
        self.rows = row  # the padding row's position
        self.tensors: dict[str, torch.Tensor] = {}
        self.pieces: dict[str, list[tuple[str, str]]] = {}
        for modality, names in self.branches.items():
            self._modality(source.store, source.session_frames, modality, names, source.missing, source.speaking,
                           source.stats.get(modality), source.branch_dims)

    def _modality(self, store, session_frames, modality, names, missing, speaking, stats, branch_dims) -> None:
        columns, column = {}, 0
        for branch in names:
            columns[branch] = (column, column + branch_dims[branch])
            column += branch_dims[branch]
        pieces, run = [], []
        for branch in names:  # consecutive dense branches share one array
            if branch in INDEXED:
                if run:
                    pieces.append(("dense", f"{modality}/{'+'.join(run)}"))
                    run = []
                pieces.append(("indexed", branch))
            else:
                run.append(branch)
        if run:
            pieces.append(("dense", f"{modality}/{'+'.join(run)}"))
        self.pieces[modality] = pieces
        arrays = {key: np.zeros((self.rows + 1, sum(branch_dims[b] for b in key.split("/", 1)[1].split("+"))),
                                dtype=np.float32) for kind, key in pieces if kind == "dense"}
        mask = np.zeros(self.rows + 1, dtype=bool)
        indexed = {b: (np.full(self.rows + 1, -1, dtype=np.int64), []) for b in names if b in INDEXED}
        table_rows = {b: 0 for b in indexed}
        for sid, n in session_frames.items():
            if (sid, modality) in missing:
                continue
            valid, rows = {}, {}
            for branch in names:
                if (sid, modality, branch) in missing:
                    continue
                if branch in INDEXED:
                    table_name, index_name = INDEXED[branch]
                    index = np.asarray(store.load(sid, branch, index_name)).astype(np.int64)
                    table = np.asarray(store.load(sid, branch, table_name))
                    store.check_finite(table, sid, branch, table_name)
                    if index.size and index.max() >= len(table):
                        raise ValueError(f"session '{sid}', branch '{branch}': {index_name} points at row "
                                         f"{int(index.max())} of a {len(table)}-row {table_name} table")
                    rows[branch] = _fit(index, n, -1)
                    valid[branch] = rows[branch] >= 0
                    indexed[branch][1].append(table)
                else:
                    features = store.load(sid, branch, "features")
                    # valid only where the branch has a frame and its mask (cut or padded to it) is set
                    branch_valid = _fit(np.asarray(store.load(sid, branch, "mask")) > 0, len(features), False)
                    valid[branch] = _fit(branch_valid, n, False)
                    rows[branch] = features
            frame_mask = np.logical_or.reduce(list(valid.values())) if valid else np.zeros(n, dtype=bool)
            if modality == "audio":
                frame_mask &= _fit(np.asarray(speaking[sid], dtype=bool), n, False)
            first = self.offsets[sid]
            mask[first: first + n] = frame_mask
            for branch in valid:
                keep = valid[branch] & frame_mask
                if branch in INDEXED:
                    shifted = np.where(keep, rows[branch] + table_rows[branch], -1)
                    indexed[branch][0][first: first + n] = shifted
                    table_rows[branch] += len(indexed[branch][1][-1])
                    continue
                key = next(k for kind, k in pieces if kind == "dense" and branch in k.split("/", 1)[1].split("+"))
                lo, hi = columns[branch]
                offset = columns[key.split("/", 1)[1].split("+")[0]][0]
                x = np.zeros((n, hi - lo), dtype=np.float32)
                m = min(n, len(rows[branch]))
                x[:m] = rows[branch][:m]
                store.check_finite(x[:m], sid, branch, "features")
                if stats is not None:  # the reference's float32 arithmetic, per frame
                    x = (x - stats[0][lo:hi]) / stats[1][lo:hi]
                x[~keep] = 0.0
                arrays[key][first: first + n, lo - offset: hi - offset] = x
        for key, array in arrays.items():
            self.tensors[key] = torch.from_numpy(array)
        self.tensors[f"{modality}/mask"] = torch.from_numpy(mask)
        for branch, (index, tables) in indexed.items():
            dim = branch_dims[branch]
            table = np.concatenate([np.asarray(t, dtype=np.float32) for t in tables] + [np.zeros((1, dim), np.float32)])
            index[index < 0] = len(table) - 1  # the zero row
            self.tensors[f"{branch}/index"] = torch.from_numpy(index)
            self.tensors[f"{branch}/table"] = torch.from_numpy(table)

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


class HostBuffers:
    """Output buffers for host-side batches, reused once nothing outside the pool shares their storage.

    At most `per_key` buffers per output; when all are held elsewhere, the oldest is left to its holder.

    Used only in the main process: a DataLoader worker hands its batch over by moving the storage
    itself into shared memory, which the main process keeps reading after the worker's references
    are gone, so workers allocate fresh buffers every time.
    """

    def __init__(self, per_key: int = 4):
        self.per_key = per_key
        self.buffers: dict[str, list[tuple[torch.Tensor, int]]] = {}
        self.enabled = hasattr(torch._C, "_storage_Use_Count")

    @staticmethod
    def _users(tensor: torch.Tensor) -> int:
        return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)

    def take(self, key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised (shape, dtype) host tensor that no live batch shares."""
        if not self.enabled or get_worker_info() is not None:
            return torch.empty(shape, dtype=dtype)
        kept = self.buffers.setdefault(key, [])
        for tensor, alone in kept:
            if tensor.shape == shape and tensor.dtype == dtype and self._users(tensor) == alone:
                return tensor
        tensor = torch.empty(shape, dtype=dtype)
        if len(kept) >= self.per_key:  # every kept buffer is busy (batches held for long): let the oldest go
            kept.pop(0)
        kept.append((tensor, self._users(tensor)))  # the count while only the pool holds it
        return tensor


class WindowBatches(Dataset):
    """One split's windows; `data[indices]` is a whole batch in the batch-dict contract, `data[i]` one window.

    Keeps `WindowDataset`'s attributes (`windows`, `ratings`, `targets`, `story`, `traits`, `traits_mask`).
    """

    def __init__(self, frames: FrameArrays, windows: pd.DataFrame, ratings: pd.DataFrame, length: int,
                 session_frames: dict[str, int], story_embeddings: np.ndarray, story_rows: dict[str, int],
                 traits: pd.DataFrame):
        self.arrays = frames
        self.windows = windows.reset_index(drop=True)
        self.length = int(length)
        self.modalities = list(frames.branches)
        labels = window_labels(self.windows, ratings, story_embeddings, story_rows, traits)
        self.targets, self.ratings, self.story, self.traits, self.traits_mask = labels
        sessions = self.windows.session_id.to_numpy()
        starts = self.windows.start.to_numpy(dtype=np.int64)
        if (starts < 0).any():
            raise ValueError(f"window starts must be >= 0, got {int(starts.min())}")
        total = np.array([session_frames[s] for s in sessions], dtype=np.int64)
        first = np.array([frames.offsets[s] for s in sessions], dtype=np.int64) + starts
        self.index = {"lengths": torch.from_numpy(np.clip(total - starts, 0, self.length)),
                      "first": torch.from_numpy(first),
                      "rating_index": torch.tensor(self.windows.rating_index.to_numpy(dtype=np.int64)),
                      "story": torch.from_numpy(self.story), "traits": torch.from_numpy(self.traits),
                      "traits_mask": torch.from_numpy(self.traits_mask), "target": torch.from_numpy(self.targets)}
        self._device = torch.device("cpu")
        self._buffers = HostBuffers()

    def to(self, device: torch.device) -> WindowBatches:
        """Per-window offsets and labels onto the arrays' device."""
        self._device = torch.device(device)
        self.index = {k: v.to(device) for k, v in self.index.items()}
        return self

    def __len__(self) -> int:
        return len(self.windows)

    def batch(self, window: torch.Tensor) -> dict:
        """The batch of windows `window` (a (B,) long tensor of positions in this split)."""
        tensors = self.arrays.tensors
        window = window.to(self._device)
        frame = torch.arange(self.length, device=self._device)
        lengths = self.index["lengths"][window]
        inside = frame[None, :] < lengths[:, None]
        rows = torch.where(inside, self.index["first"][window][:, None] + frame[None, :], self.arrays.rows).reshape(-1)
        shape = inside.shape
        batch: dict = {}
        for modality in self.modalities:
            parts = []
            for kind, key in self.arrays.pieces[modality]:
                if kind == "dense":
                    parts.append(self._select(tensors[key], rows, key))
                else:
                    parts.append(self._select(tensors[f"{key}/table"], tensors[f"{key}/index"].index_select(0, rows), key))
            if len(parts) > 1:
                x = self._empty(modality, (len(rows), sum(p.shape[1] for p in parts)), parts[0].dtype)
                x = torch.cat(parts, dim=-1, out=x)
            else:
                x = parts[0]
            batch[modality] = {"x": x.view(*shape, -1), "mask": tensors[f"{modality}/mask"].index_select(0, rows).view(shape),
                               "lengths": lengths}
        for key in ("story", "traits", "traits_mask", "target", "rating_index"):
            batch[key] = self.index[key][window]
        return batch

    def _empty(self, key: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self._device.type == "cpu":
            return self._buffers.take(key, shape, dtype)
        return torch.empty(shape, dtype=dtype, device=self._device)  # the CUDA caching allocator reuses memory

    def _select(self, source: torch.Tensor, rows: torch.Tensor, key: str) -> torch.Tensor:
        """source[rows] into a (reused, on the host) buffer."""
        out = self._empty(key, (len(rows),) + tuple(source.shape[1:]), source.dtype)
        return torch.index_select(source, 0, rows, out=out)

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
        # DistributedSampler's attributes, as Lightning reads them (e.g. `shuffle`), taken from the inner sampler
        self.dataset = getattr(windows, "dataset", None)
        self.num_replicas = getattr(windows, "num_replicas", 1)
        self.rank = getattr(windows, "rank", 0)
        self.shuffle = getattr(windows, "shuffle", False)
        self.seed = getattr(windows, "seed", 0)
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
